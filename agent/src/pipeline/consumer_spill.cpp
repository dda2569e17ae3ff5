#include "pipeline/consumer_spill.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <system_error>

#include "base/error.hpp"
#include "base/files.hpp"
#include "base/log.hpp"
#include "wire/wire.hpp"

namespace numastream {

namespace {

// The consumer a spill directory belongs to (its file `consumer`): written when the directory is
// first used; a directory that names another consumer is refused. The directory is the agent's
// own (0700) whatever the umask (a gateway with file sinks runs under the files' umask, 0137 for
// 0640, under which a directory would have no search bit). An empty file is a claim a crash cut
// short before it reached the disk: nothing was spilled under it, so it is claimed again.
void claim(const std::string& dir, const std::string& identity) {
  try {
    make_parent_dirs(dir + "/", 0600);
  } catch (const std::system_error& e) {
    throw std::runtime_error("spill: cannot create " + dir + ": " + e.what());
  }
  const std::string file = dir + "/consumer";
  std::ifstream in(file);
  if (in) {
    std::string held((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    while (!held.empty() && held.back() == '\n') held.pop_back();
    if (held == identity) return;
    if (!held.empty()) {
      throw std::runtime_error("spill " + dir + " holds what consumer \"" + held +
                               "\" did not take yet, not consumer \"" + identity +
                               "\": give each consumer its own spill path (move that one aside "
                               "only once its chunks are not needed)");
    }
  }
  const std::string tmp = file + ".tmp";
  const std::string text = identity + "\n";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw_errno("spill " + dir + ": cannot write " + tmp);
  const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
                       ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!written) {
    errno = err;
    throw_errno("spill " + dir + ": cannot write " + tmp);
  }
  std::filesystem::rename(tmp, file);
}

// The number a spill directory's segment files carry (spill-<n>-<segment>.seg): the one already
// there (versions before 0.2 named it by the consumer's position in `sinks`), else 0.
std::uint32_t segment_key(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename();
    unsigned n = 0;
    int used = 0;
    if (std::sscanf(name.c_str(), "spill-%u-%*u.seg%n", &n, &used) >= 1 &&
        used == static_cast<int>(name.size()))
      return n;
  }
  return 0;
}

}  // namespace

namespace {
// Each record: the frame, then the XXH3-64 of its payload (little-endian).
constexpr std::size_t kTrailer = 8;

// The frame a record holds, and whether it carries a trailer (a record of an earlier version
// does not): the header's payload size says which.
wire::DecodeError record_header(std::span<const std::byte> head, std::size_t size, wire::Header& h,
                                bool& trailer) {
  trailer = size >= wire::kHeaderSize + kTrailer &&
            wire::decode_data_header(head, size - kTrailer, SIZE_MAX, h) == wire::DecodeError::ok;
  return trailer ? wire::DecodeError::ok : wire::decode_data_header(head, size, SIZE_MAX, h);
}
}  // namespace

ConsumerSpill::ConsumerSpill(const SpillConfig& cfg, std::uint32_t index,
                             const std::string& identity, AckFn settle, LostFn lost)
    : store_((claim(cfg.path, identity),
              std::make_unique<SpillStore>(
                  cfg.path, segment_key(cfg.path), cfg.max_bytes,
                  [this](std::span<const std::byte> head, std::size_t size) {
                    // A record whose frame header does not decode (damaged on disk) ends the
                    // recovery there, named in the log and the summary: handed on, it would stop
                    // this process and every next one at the same record.
                    wire::Header h;
                    bool trailer = false;
                    if (record_header(head, size, h, trailer) != wire::DecodeError::ok)
                      return false;
                    holding_[h.stream_id].insert(h.sequence);
                    return true;
                  }))),
      settle_(std::move(settle)),
      lost_(std::move(lost)) {
  pending_bytes_ = store_->pending_bytes();
  const auto& r = store_->recovered();
  recovered_owed_ = recovered_unread_ = r.frames;
  if (r.frames > 0 || !r.why_dropped.empty()) {
    log_line("consumer " + std::to_string(index) + ": " + std::to_string(r.frames) +
             " chunks an earlier process spilled go to its sink first" +
             (r.why_dropped.empty() ? "" : "; " + r.why_dropped));
  }
}

bool ConsumerSpill::put(Chunk& c, const std::function<bool()>& closing) {
  std::unique_lock lock(mu_);
  std::byte head[wire::kHeaderSize];
  wire::encode_header(c.header, head);
  const auto payload = c.payload();
  const std::uint64_t sum = wire::checksum(payload);
  std::byte trailer[kTrailer];
  for (std::size_t i = 0; i < kTrailer; ++i) trailer[i] = static_cast<std::byte>(sum >> (8 * i));
  while (!store_->append(head, payload, trailer)) {
    // Full: this consumer holds the others back now, until its sink has read some out.
    if (closing()) return false;
    room_.wait_for(lock, std::chrono::milliseconds(50));
  }
  ++spilled_;
  ++owed_[c.header.stream_id];
  holding_[c.header.stream_id].insert(c.header.sequence);
  peak_bytes_ = std::max<std::uint64_t>(peak_bytes_.load(), store_->disk_bytes());
  pending_bytes_ = store_->pending_bytes();
  lock.unlock();
  ready_.notify_one();
  settle_(c.via, c.header.stream_id, c.header.sequence);  // where it cannot be lost: taken
  return true;
}

std::optional<Chunk> ConsumerSpill::take(std::chrono::milliseconds wait, std::size_t max_payload) {
  std::unique_lock lock(mu_);
  while (true) {
    if (!ready_.wait_for(lock, wait, [this] { return !store_->empty(); })) return std::nullopt;
    const std::size_t size = store_->next_size();
    zmq::Message m = zmq::Message::sized(size);
    std::uint64_t token = 0;
    const std::size_t n = store_->read({m.mutable_data(), size}, &token);
    pending_bytes_ = store_->pending_bytes();
    room_.notify_all();
    const std::byte* p = m.mutable_data();
    Chunk c;
    bool trailer = false;
    if (record_header({p, std::min(n, wire::kHeaderSize)}, n, c.header, trailer) !=
            wire::DecodeError::ok ||
        wire::decode({p, trailer ? n - kTrailer : n}, max_payload, c.header) !=
            wire::DecodeError::ok) {
      throw std::runtime_error("consumer spill: a frame read back from " + store_->dir() +
                               " is damaged");
    }
    const bool recovered = recovered_unread_ > 0;  // an earlier process's come first
    if (recovered) --recovered_unread_;
    if (trailer) {
      std::uint64_t sum = 0;
      for (std::size_t i = 0; i < kTrailer; ++i)
        sum |= static_cast<std::uint64_t>(p[n - kTrailer + i]) << (8 * i);
      if (sum != wire::checksum({p + wire::kHeaderSize, c.header.payload_size})) {
        declare_damaged(c.header, token, recovered);
        continue;
      }
    }
    // The frame alone (the trailer left out, uncopied): an onward hop sends it as it is.
    c.body = trailer ? zmq::Message::slice(std::move(m), 0, n - kTrailer) : std::move(m);
    c.body_offset = wire::kHeaderSize;
    held_.emplace(std::pair{c.header.stream_id, c.header.sequence}, token);
    c.via = recovered ? -2 : -1;
    return c;
  }
}

void ConsumerSpill::declare_damaged(const wire::Header& h, std::uint64_t token, bool recovered) {
  const std::string what =
      "stream " + std::to_string(h.stream_id) + " chunk " + std::to_string(h.sequence);
  log_error("consumer spill " + store_->dir() + ": " + what +
            " read back damaged (its payload is not what was written): lost");
  ++damaged_;
  damaged_last_.push_back(what);
  if (damaged_last_.size() > 5) damaged_last_.erase(damaged_last_.begin());
  store_->release(token);
  if (auto it = holding_.find(h.stream_id); it != holding_.end()) {
    it->second.erase(h.sequence);
    if (it->second.empty()) holding_.erase(it);
  }
  if (recovered) {
    --recovered_owed_;
  } else if (auto it = owed_.find(h.stream_id); it != owed_.end() && --it->second == 0) {
    owed_.erase(it);
  }
  if (lost_) lost_(h.stream_id, h.sequence);
}

void ConsumerSpill::taken(int via, std::uint32_t stream, std::uint64_t seq) {
  std::lock_guard lock(mu_);
  if (auto it = held_.find({stream, seq}); it != held_.end()) {
    store_->release(it->second);
    held_.erase(it);
    room_.notify_all();  // its segment may be gone now
  }
  if (auto it = holding_.find(stream); it != holding_.end()) {
    it->second.erase(seq);
    if (it->second.empty()) holding_.erase(it);
  }
  if (via == -2 && recovered_owed_ > 0) {
    --recovered_owed_;
    return;
  }
  if (auto it = owed_.find(stream); it != owed_.end() && --it->second == 0) owed_.erase(it);
}

std::pair<std::uint64_t, std::vector<std::uint64_t>> without_held(
    std::uint64_t floor, const std::vector<std::uint64_t>& above,
    const std::set<std::uint64_t>& held) {
  if (held.empty()) return {floor, above};
  const std::uint64_t low = std::min(floor, *held.begin());
  std::vector<std::uint64_t> out;
  for (std::uint64_t seq = low; seq < floor; ++seq) {
    if (!held.count(seq)) out.push_back(seq);
  }
  for (std::uint64_t seq : above) {
    if (!held.count(seq)) out.push_back(seq);
  }
  return {low, out};
}

std::pair<std::uint64_t, std::vector<std::uint64_t>> ConsumerSpill::had(
    std::uint32_t stream, std::uint64_t floor, const std::vector<std::uint64_t>& above) {
  std::lock_guard lock(mu_);
  const auto it = holding_.find(stream);
  return it == holding_.end() ? std::pair{floor, above} : without_held(floor, above, it->second);
}

bool ConsumerSpill::owes(std::uint32_t stream) {
  std::lock_guard lock(mu_);
  return recovered_owed_ > 0 || owed_.count(stream) > 0;
}

nlohmann::json ConsumerSpill::report() const {
  std::lock_guard lock(mu_);
  return {{"path", store_->dir()},
          {"max_bytes", store_->max_bytes()},
          {"spilled", spilled_.load()},
          {"peak_bytes", peak_bytes_.load()},
          {"pending_bytes", pending_bytes_.load()},
          {"recovered", store_->recovered().frames},
          {"dropped_bytes", store_->recovered().dropped_bytes},
          {"dropped", store_->recovered().why_dropped},
          {"damaged", damaged_},
          {"damaged_last", damaged_last_}};
}

}  // namespace numastream
