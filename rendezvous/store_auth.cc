#include "rendezvous/store_auth.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/check.h"

namespace cpprun::rendezvous {

namespace {

std::string proof(std::string_view label, std::string_view secret, std::string_view client_nonce,
                  std::string_view server_nonce) {
  std::string message(label);
  message.push_back('\0');
  message.append(client_nonce);
  message.append(server_nonce);
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  const unsigned char* done =
      HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), out, &size);
  CPPRUN_CHECK(done != nullptr && size == kAuthProofBytes);
  return std::string(reinterpret_cast<const char*>(out), size);
}

std::string trimmed(const std::string& s) {
  const char* space = " \t\r\n";
  const size_t begin = s.find_first_not_of(space);
  if (begin == std::string::npos) return "";
  return s.substr(begin, s.find_last_not_of(space) - begin + 1);
}

}  // namespace

std::string randomBytes(size_t n) {
  std::string out(n, '\0');
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::getrandom(out.data() + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    CPPRUN_CHECK(r > 0);  // getrandom cannot fail for small sizes once the pool is ready
    got += static_cast<size_t>(r);
  }
  return out;
}

std::string serverProof(std::string_view secret, std::string_view client_nonce,
                        std::string_view server_nonce) {
  return proof("cpprun store server v1", secret, client_nonce, server_nonce);
}

std::string clientProof(std::string_view secret, std::string_view client_nonce,
                        std::string_view server_nonce) {
  return proof("cpprun store client v1", secret, client_nonce, server_nonce);
}

bool proofsEqual(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

bool isProtectedKey(std::string_view key) {
  return key.substr(0, kProtectedPrefix.size()) == kProtectedPrefix;
}

const std::string* protectedWrite(const wire::Request& r) {
  using wire::QueryType;
  switch (r.type) {
    case QueryType::SET:
    case QueryType::COMPARE_SET:
    case QueryType::ADD:
    case QueryType::DELETE_KEY:
    case QueryType::APPEND:
    case QueryType::MULTI_SET:
    case QueryType::QUEUE_PUSH:
    case QueryType::QUEUE_POP:
    case QueryType::BARRIER:
      for (const std::string& key : r.keys) {
        if (isProtectedKey(key)) return &key;
      }
      return nullptr;
    default:
      return nullptr;
  }
}

Status checkJobSecret(const std::string& secret, const std::string& where) {
  if (secret.size() < kMinSecretBytes) {
    return invalidArgument(where + " holds " + std::to_string(secret.size()) +
                           " bytes; a secret has at least " + std::to_string(kMinSecretBytes) +
                           " (e.g. `openssl rand -hex 32`)");
  }
  return Status::ok();
}

Result<std::string> readSecretFile(const std::string& path, const std::string& what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    return invalidArgument(
        what + " " + path + ": " +
        (err == ELOOP ? std::string("is a symbolic link") : std::string(std::strerror(err))));
  }
  struct stat st {};
  std::string why;
  if (::fstat(fd, &st) != 0) {
    why = std::strerror(errno);
  } else if (!S_ISREG(st.st_mode)) {
    why = "is not a regular file";
  } else if (st.st_uid != ::geteuid()) {
    why = "is owned by uid " + std::to_string(st.st_uid) + ", not by this user";
  } else if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    why = std::string("has mode ") + mode + ": group and others must have no access (chmod 600)";
  } else if (st.st_size > 4096) {
    why = "is larger than 4096 bytes";
  }
  std::string content;
  if (why.empty()) {
    char buf[4097];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof(buf))) != 0) {
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        why = std::strerror(errno);
        break;
      }
      content.append(buf, static_cast<size_t>(n));
      if (content.size() > 4096) break;
    }
  }
  ::close(fd);
  if (!why.empty()) return invalidArgument(what + " " + path + " " + why);
  const std::string secret = trimmed(content);
  if (Status s = checkJobSecret(secret, what + " " + path); !s.isOk()) return s;
  return secret;
}

Result<std::string> readJobSecret(const std::string& path) {
  return readSecretFile(path, "the job secret file");
}

}  // namespace cpprun::rendezvous
