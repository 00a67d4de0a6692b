#include "examples/mnist/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

namespace cpprun::mnist {
namespace {

constexpr char kMagic[8] = {'C', 'P', 'R', 'N', 'C', 'K', 'P', 'T'};
constexpr uint32_t kVersion = 1;

void appendBytes(std::string& out, const void* data, size_t n) {
  out.append(static_cast<const char*>(data), n);
}
void appendU32(std::string& out, uint32_t v) {
  unsigned char b[4] = {static_cast<unsigned char>(v), static_cast<unsigned char>(v >> 8),
                        static_cast<unsigned char>(v >> 16), static_cast<unsigned char>(v >> 24)};
  appendBytes(out, b, 4);
}
uint32_t readU32(const std::string& in, size_t at) {
  const auto* b = reinterpret_cast<const unsigned char*>(in.data() + at);
  return static_cast<uint32_t>(b[0]) | static_cast<uint32_t>(b[1]) << 8 |
         static_cast<uint32_t>(b[2]) << 16 | static_cast<uint32_t>(b[3]) << 24;
}
uint32_t crcOf(const std::string& bytes, size_t n) {
  return static_cast<uint32_t>(
      crc32(0L, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(n)));
}

Status errnoStatus(const std::string& what) {
  return Status(StatusCode::kUnavailable, what + ": " + std::strerror(errno));
}

Status writeAllAndSync(const std::string& path, const std::string& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errnoStatus("create " + path);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      Status s = errnoStatus("write " + path);
      ::close(fd);
      return s;
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    Status s = errnoStatus("fsync " + path);
    ::close(fd);
    return s;
  }
  if (::close(fd) != 0) return errnoStatus("close " + path);
  return Status::ok();
}

}  // namespace

std::string latestCheckpointPath(const std::string& dir) { return dir + "/latest.ckpt"; }

Status makeCheckpointDirectory(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return invalidArgument("--checkpoint-dir " + dir + ": cannot create it: " + error.message());
  }
  return Status::ok();
}

Status saveCheckpoint(const std::string& path, const Checkpoint& c) {
  nlohmann::json header = {{"model", c.model},
                           {"optimizer", c.optimizer},
                           {"parameter_count", c.parameters.size()},
                           {"buffers", c.optimizer_buffers.size()},
                           {"optimizer_steps", c.optimizer_steps},
                           {"epochs_done", c.epochs_done},
                           {"batches_done", c.batches_done},
                           {"seed", c.seed},
                           {"world_size", c.world_size}};
  const std::string header_text = header.dump();
  std::string bytes;
  bytes.reserve(64 + header_text.size() +
                sizeof(float) * c.parameters.size() * (1 + c.optimizer_buffers.size()));
  appendBytes(bytes, kMagic, sizeof(kMagic));
  appendU32(bytes, kVersion);
  appendU32(bytes, static_cast<uint32_t>(header_text.size()));
  bytes += header_text;
  appendBytes(bytes, c.parameters.data(), sizeof(float) * c.parameters.size());
  for (const auto& buffer : c.optimizer_buffers) {
    if (buffer.size() != c.parameters.size()) {
      return invalidArgument("checkpoint: an optimizer buffer's size differs from the model's");
    }
    appendBytes(bytes, buffer.data(), sizeof(float) * buffer.size());
  }
  appendU32(bytes, crcOf(bytes, bytes.size()));

  const std::string temporary = path + ".tmp." + std::to_string(::getpid());
  if (Status s = writeAllAndSync(temporary, bytes); !s.isOk()) {
    ::unlink(temporary.c_str());
    return s;
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    Status s = errnoStatus("rename " + temporary + " to " + path);
    ::unlink(temporary.c_str());
    return s;
  }
  const std::string dir =
      path.find('/') == std::string::npos ? "." : path.substr(0, path.rfind('/'));
  const int dir_fd = ::open(dir.empty() ? "/" : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
  return Status::ok();
}

Result<Checkpoint> loadCheckpoint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return Status(StatusCode::kNotFound,
                  "checkpoint " + path + ": cannot open: " + std::strerror(errno));
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto corrupt = [&](const std::string& why) {
    return invalidArgument("checkpoint " + path + " is corrupt: " + why +
                           " (delete it to start afresh)");
  };
  if (bytes.size() < sizeof(kMagic) + 12 ||
      std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return corrupt("not a cpprun-mnist checkpoint (bad magic)");
  }
  const uint32_t stored_crc = readU32(bytes, bytes.size() - 4);
  if (crcOf(bytes, bytes.size() - 4) != stored_crc) return corrupt("CRC-32 mismatch");
  const uint32_t version = readU32(bytes, 8);
  if (version != kVersion) return corrupt("unsupported version " + std::to_string(version));
  const uint32_t header_len = readU32(bytes, 12);
  if (16 + static_cast<size_t>(header_len) > bytes.size() - 4)
    return corrupt("header runs past the end");
  nlohmann::json header =
      nlohmann::json::parse(bytes.begin() + 16, bytes.begin() + 16 + header_len, nullptr, false);
  if (header.is_discarded() || !header.is_object()) return corrupt("header is not JSON");
  Checkpoint c;
  size_t count = 0;
  size_t buffers = 0;
  try {
    c.model = header.at("model").get<std::string>();
    c.optimizer = header.at("optimizer").get<std::string>();
    count = header.at("parameter_count").get<size_t>();
    buffers = header.at("buffers").get<size_t>();
    c.optimizer_steps = header.at("optimizer_steps").get<int64_t>();
    c.epochs_done = header.at("epochs_done").get<int>();
    c.batches_done = header.value("batches_done", 0);  // absent in files of earlier versions
    c.seed = header.at("seed").get<uint64_t>();
    c.world_size = header.at("world_size").get<int>();
  } catch (const nlohmann::json::exception& e) {
    return corrupt(std::string("header: ") + e.what());
  }
  const size_t body = 16 + header_len;
  const size_t expected = body + sizeof(float) * count * (1 + buffers) + 4;
  if (buffers > 8 || count > (1u << 30) || expected != bytes.size()) {
    return corrupt("size " + std::to_string(bytes.size()) + " bytes, header implies " +
                   std::to_string(expected));
  }
  c.parameters.resize(count);
  std::memcpy(c.parameters.data(), bytes.data() + body, sizeof(float) * count);
  for (size_t b = 0; b < buffers; ++b) {
    std::vector<float> buffer(count);
    std::memcpy(buffer.data(), bytes.data() + body + sizeof(float) * count * (1 + b),
                sizeof(float) * count);
    c.optimizer_buffers.push_back(std::move(buffer));
  }
  return c;
}

}  // namespace cpprun::mnist
