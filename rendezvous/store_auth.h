// Store authentication: how the agents of one job prove to the store host (and it to them) that
// they hold the job's secret, so that only they write the job's keys ("cpprun/...").
//
// The handshake is one operation of cpprun's own in the wire table, CPPRUN_AUTH (wire byte 96 in
// every dialect, a key and a value, a value in reply), sent twice on a connection, after torch's
// VALIDATE + PING:
//
//   client: CPPRUN_AUTH "hello" <client nonce, 32 random bytes>
//   server: <server nonce, 32 bytes> <server proof>          (empty: the store has no secret)
//   client: CPPRUN_AUTH "proof" <client proof>
//   server: "ok"                                              (a wrong proof: the server closes)
//
// with proof = HMAC-SHA256(secret, label || client nonce || server nonce) and the labels
// "cpprun store server v1" and "cpprun store client v1". Both sides prove knowledge of the secret
// without sending it, and fresh nonces on both sides make a recorded proof useless on another
// connection. The client checks the server's proof first, so a squatter on the store's port
// learns nothing it could replay and cannot pass for the job's store.
//
// A store with a secret refuses, by closing the connection, every write (SET, COMPARE_SET, ADD,
// DELETE_KEY, APPEND, MULTI_SET, QUEUE_PUSH/POP, BARRIER) of a key under kProtectedPrefix from
// a connection that has not authenticated; reads stay open to every client, and keys outside
// the prefix stay writable (torch's clients in the workers cannot authenticate: they read the
// job's keys they need and write their own). docs/security.md states the threat model.
//
// Thread safety: pure functions, except readSecretFile and readJobSecret (read a file).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "common/status.h"
#include "rendezvous/wire.h"

namespace cpprun::rendezvous {

// The keys only authenticated clients may write, when the store has a secret.
inline constexpr std::string_view kProtectedPrefix = "cpprun/";
// Set at the store's root by a store host that has a secret (its value: the scheme), so that an
// agent without the secret says so at once instead of being cut off at its first write.
inline constexpr const char* kAuthRequiredKey = "cpprun/auth_required";
inline constexpr const char* kAuthScheme = "hmac-sha256-v1";

inline constexpr size_t kAuthNonceBytes = 32;
inline constexpr size_t kAuthProofBytes = 32;  // SHA-256
// The shortest secret accepted: 128 bits (32 hex digits).
inline constexpr size_t kMinSecretBytes = 16;

// "hello" and "proof": the two steps' keys.
inline constexpr const char* kAuthHello = "hello";
inline constexpr const char* kAuthProof = "proof";

// `n` bytes from the kernel's random source (getrandom).
std::string randomBytes(size_t n);

// The server's and the client's proofs for one connection's nonces.
std::string serverProof(std::string_view secret, std::string_view client_nonce,
                        std::string_view server_nonce);
std::string clientProof(std::string_view secret, std::string_view client_nonce,
                        std::string_view server_nonce);
// Compares two proofs in time independent of where they differ.
bool proofsEqual(std::string_view a, std::string_view b);

// Whether `key` is one only an authenticated client may write.
bool isProtectedKey(std::string_view key);
// The first protected key `request` would write, or nullptr when it writes none.
const std::string* protectedWrite(const wire::Request& request);

// A secret from a file: a regular file (not a link) of at most 4096 bytes, owned by this user
// and not readable or writable by group or others (like ssh's keys), holding at least
// kMinSecretBytes after surrounding whitespace is trimmed. An error (kInvalidArgument) starts
// with `what` and the path ("the job secret file /p has mode 0644: ...") and says what is wrong.
// Also reads the agent's HTTP token (--metrics-token-file).
Result<std::string> readSecretFile(const std::string& path, const std::string& what);
// The job's secret from a file (readSecretFile, "the job secret file").
Result<std::string> readJobSecret(const std::string& path);
// Checks a secret given in the environment (CPPRUN_RDZV_SECRET): at least kMinSecretBytes.
Status checkJobSecret(const std::string& secret, const std::string& where);

}  // namespace cpprun::rendezvous
