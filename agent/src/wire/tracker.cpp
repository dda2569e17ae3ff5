#include "wire/tracker.hpp"

#include <algorithm>

namespace numastream {

std::uint64_t StreamTracker::Stream::lost() const {
  std::uint64_t accounted = delivered + before + corrupt;
  std::uint64_t missing = expected() > accounted ? expected() - accounted : 0;
  return missing + unwritten;
}

void StreamTracker::on_frame(std::uint32_t stream, std::size_t wire_bytes) {
  std::lock_guard lock(mu_);
  streams_[stream].wire_bytes += wire_bytes;
  last_ = std::chrono::steady_clock::now();
}

StreamTracker::Verdict StreamTracker::on_chunk(std::uint32_t stream, std::uint64_t seq, bool ok,
                                               std::size_t raw_bytes) {
  std::lock_guard lock(mu_);
  Stream& s = streams_[stream];
  last_ = std::chrono::steady_clock::now();
  s.highest = std::max(s.highest, seq + 1);
  if (!ok) {
    ++s.corrupt;
    return Verdict::corrupt;
  }
  std::size_t w = seq / 64;
  if (w >= s.seen.size()) s.seen.resize(std::max(w + 1, s.seen.size() * 2), 0);
  std::uint64_t bit = std::uint64_t{1} << (seq % 64);
  if (s.seen[w] & bit) {
    ++s.duplicates;
    return Verdict::duplicate;
  }
  s.seen[w] |= bit;
  ++s.delivered;
  s.raw_bytes += raw_bytes;
  return Verdict::delivered;
}

void StreamTracker::on_end_of_stream(const wire::Header& h, const wire::EndOfStream& eos) {
  std::lock_guard lock(mu_);
  Stream& s = streams_[h.stream_id];
  last_ = std::chrono::steady_clock::now();
  s.connections = h.connections;
  s.ended.insert(h.connection);
  s.eos = eos;
}

void StreamTracker::on_resume(std::uint32_t stream, std::uint64_t floor,
                              std::span<const std::uint64_t> seqs) {
  std::lock_guard lock(mu_);
  Stream& s = streams_[stream];
  auto mark = [&](std::uint64_t seq) {
    std::size_t w = seq / 64;
    if (w >= s.seen.size()) s.seen.resize(std::max(w + 1, s.seen.size() * 2), 0);
    std::uint64_t bit = std::uint64_t{1} << (seq % 64);
    if (s.seen[w] & bit) return;
    s.seen[w] |= bit;
    ++s.before;
    s.highest = std::max(s.highest, seq + 1);
  };
  for (std::uint64_t seq = 0; seq < floor; ++seq) mark(seq);
  for (auto seq : seqs) mark(seq);
}

bool StreamTracker::resumed(std::uint32_t stream) const {
  std::lock_guard lock(mu_);
  auto it = streams_.find(stream);
  return it != streams_.end() && it->second.before > 0;
}

void StreamTracker::on_unwritten(std::uint32_t stream, std::uint64_t /*seq*/) {
  std::lock_guard lock(mu_);
  ++streams_[stream].unwritten;
}

int StreamTracker::complete_streams() const {
  std::lock_guard lock(mu_);
  return static_cast<int>(std::count_if(streams_.begin(), streams_.end(),
                                        [](const auto& kv) { return kv.second.complete(); }));
}

bool StreamTracker::started() const {
  std::lock_guard lock(mu_);
  return last_.has_value();
}

std::chrono::steady_clock::time_point StreamTracker::last_activity() const {
  std::lock_guard lock(mu_);
  return last_.value_or(std::chrono::steady_clock::now());
}

StreamTracker::Totals StreamTracker::totals() const {
  std::lock_guard lock(mu_);
  Totals t;
  for (const auto& [id, s] : streams_) {
    t.delivered += s.delivered;
    t.delivered_before += s.before;
    t.duplicates += s.duplicates;
    t.corrupt += s.corrupt;
    t.unwritten += s.unwritten;
    t.lost += s.lost();
    t.raw_bytes += s.raw_bytes;
    t.wire_bytes += s.wire_bytes;
    t.complete = t.complete && s.complete();
  }
  return t;
}

std::optional<wire::EndOfStream> StreamTracker::end_of_stream(std::uint32_t stream) const {
  std::lock_guard lock(mu_);
  auto it = streams_.find(stream);
  if (it == streams_.end()) return std::nullopt;
  return it->second.eos;
}

nlohmann::json StreamTracker::streams_json(std::size_t max_ranges) const {
  std::lock_guard lock(mu_);
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [id, s] : streams_) {
    nlohmann::json missing = nlohmann::json::array();
    std::uint64_t expected = s.expected();
    for (std::uint64_t seq = 0; seq < expected && missing.size() < max_ranges;) {
      if (s.has(seq)) {
        ++seq;
        continue;
      }
      std::uint64_t end = seq;
      while (end + 1 < expected && !s.has(end + 1)) ++end;
      missing.push_back(seq == end ? std::to_string(seq)
                                   : std::to_string(seq) + "-" + std::to_string(end));
      seq = end + 1;
    }
    out.push_back({{"stream_id", id},
                   {"complete", s.complete()},
                   {"expected_chunks", s.eos ? nlohmann::json(s.eos->total_chunks) : nlohmann::json(nullptr)},
                   {"delivered", s.delivered},
                   {"delivered_before", s.before},
                   {"lost", s.lost()},
                   {"corrupt", s.corrupt},
                   {"duplicates", s.duplicates},
                   {"unwritten", s.unwritten},
                   {"connections_ended", s.ended.size()},
                   {"connections", s.connections},
                   {"missing", missing}});
  }
  return out;
}

}  // namespace numastream
