#include "wire/tracker.hpp"

#include <algorithm>

namespace numastream {

using wire::DecodeError;

std::uint64_t StreamTracker::Stream::lost() const {
  std::uint64_t accounted = delivered + before + corrupt;
  std::uint64_t missing = expected() > accounted ? expected() - accounted : 0;
  return missing + unwritten;
}

bool StreamTracker::Stream::bounded() const {
  return std::any_of(gaps.begin(), gaps.end(), [](const wire::Gap& g) {
    return g.reason == wire::GapReason::sender_restarted_bound;
  });
}

std::vector<wire::Gap> StreamTracker::Stream::missing_part(const wire::Gap& g,
                                                           std::uint64_t window) const {
  std::vector<wire::Gap> out;
  auto add = [&](std::uint64_t first, std::uint64_t end) {
    if (!out.empty() && out.back().end == first) {
      out.back().end = end;
    } else {
      out.push_back({first, end, g.reason});
    }
  };
  std::uint64_t q = g.first, looked = 0;
  while (q < g.end) {
    if (q < resumed.floor()) {  // settled by a resume: delivered earlier, so missing now
      const std::uint64_t e = std::min(g.end, resumed.floor());
      add(q, e);
      q = e;
      continue;
    }
    if (q >= std::max(settled.end(), settled.floor()) || ++looked > window) {
      add(q, g.end);  // nothing here (or more than a window to look at: said missing, never less)
      break;
    }
    if (!settled.contains(q) || resumed.contains(q)) add(q, q + 1);
    ++q;
  }
  return out;
}

StreamTracker::Stream* StreamTracker::find_or_add(std::uint32_t stream) {
  auto it = streams_.find(stream);
  if (it != streams_.end()) return &it->second;
  if (streams_.size() >= max_streams_) return nullptr;
  return &streams_.try_emplace(stream, window_).first->second;
}

StreamTracker::Stream& StreamTracker::must(std::uint32_t stream) {
  return streams_.try_emplace(stream, window_).first->second;
}

DecodeError StreamTracker::admit(std::uint32_t stream, std::uint64_t seq) {
  std::lock_guard lock(mu_);
  Stream* s = find_or_add(stream);
  if (!s) return DecodeError::too_many_streams;
  if (!s->settled.fits(seq)) return DecodeError::out_of_window;
  if (s->eos && seq >= s->eos->total_chunks) return DecodeError::out_of_window;
  s->known = true;
  return DecodeError::ok;
}

DecodeError StreamTracker::admit_stream(std::uint32_t stream) {
  std::lock_guard lock(mu_);
  return find_or_add(stream) ? DecodeError::ok : DecodeError::too_many_streams;
}

DecodeError StreamTracker::on_resume(std::uint32_t stream, std::uint64_t floor,
                                     std::span<const std::uint64_t> seqs) {
  std::lock_guard lock(mu_);
  Stream* s = find_or_add(stream);
  if (!s) return DecodeError::too_many_streams;
  // A stream this receiver knows nothing of may start anywhere (a receiver replaced mid-stream
  // learns where its stream is from the first resume); a known one only within its window.
  if (floor > SeqSet::kMaxSeq) return DecodeError::out_of_window;
  // Fresh: no frame of it taken yet (decided here, by the receiving thread, not by what the
  // decompressors have got to: a far floor right after a data frame is refused, however late
  // that frame is decoded).
  const bool fresh = !s->known;
  if (!fresh && floor > s->settled.floor() && floor - s->settled.floor() > window_)
    return DecodeError::out_of_window;
  const std::uint64_t base = std::max(floor, s->settled.floor());
  for (auto seq : seqs) {
    if (seq >= base && seq - base >= window_) return DecodeError::out_of_window;
  }
  s->known = true;
  s->before += s->settled.raise_floor(floor);
  s->resumed.raise_floor(floor);
  for (auto seq : seqs) {
    if (s->settled.insert(seq)) ++s->before;
    s->resumed.insert(seq);
  }
  return DecodeError::ok;
}

DecodeError StreamTracker::on_gaps(std::uint32_t stream, std::span<const wire::Gap> incoming,
                                   std::vector<wire::Gap>* missing_out) {
  std::lock_guard lock(mu_);
  Stream* s = find_or_add(stream);
  if (!s) return DecodeError::too_many_streams;
  // Every gap starts inside the window and spans at most a window from where it starts to count.
  const std::uint64_t floor = s->settled.floor();
  for (const auto& g : incoming) {
    if (g.end <= g.first) return DecodeError::bad_type;
    if (g.end > SeqSet::kMaxSeq) return DecodeError::out_of_window;
    if (g.first >= floor && g.first - floor >= window_) return DecodeError::out_of_window;
    if (g.end > floor && g.end - std::max(g.first, floor) > window_)
      return DecodeError::out_of_window;
    if (s->eos && g.end > s->eos->total_chunks) return DecodeError::contradicts_stream;
  }
  // The parts no earlier gap declared.
  std::vector<wire::Gap> fresh;
  for (const auto& g : incoming) {
    std::uint64_t at = g.first;
    for (const auto& old : s->gaps) {
      if (old.end <= at) continue;
      if (old.first >= g.end) break;
      if (old.first > at) fresh.push_back({at, old.first, g.reason});
      at = std::max(at, old.end);
      if (at >= g.end) break;
    }
    if (at < g.end) fresh.push_back({at, g.end, g.reason});
  }
  // Of those, what this instance did not deliver: that is what is missing.
  std::vector<wire::Gap> missing;
  for (const auto& g : fresh) {
    for (const auto& part : s->missing_part(g, window_)) missing.push_back(part);
  }
  if (s->gaps.size() + missing.size() > kMaxGaps) return DecodeError::out_of_window;
  if (missing_out) *missing_out = missing;
  for (const auto& g : missing) {
    std::uint64_t newly = 0;
    if (g.first <= s->settled.floor()) {
      newly = s->settled.raise_floor(g.end);
    } else {
      for (std::uint64_t q = g.first; q < g.end; ++q) newly += s->settled.insert(q) ? 1 : 0;
    }
    // Already settled: a resume counted them as delivered earlier (a restarted receiver learns
    // the gap again from the sender). They are missing, not delivered.
    const std::uint64_t recounted = std::min(s->before, g.size() - newly);
    s->before -= recounted;
    // Counted missing: what the gap moved out of nowhere or out of "delivered before" (a chunk
    // that a resume listed but this instance delivered stays delivered).
    s->declared += newly + recounted;
    auto at = std::lower_bound(s->gaps.begin(), s->gaps.end(), g.first,
                               [](const wire::Gap& x, std::uint64_t v) { return x.first < v; });
    s->gaps.insert(at, g);
  }
  // Adjacent gaps of one reason are one.
  std::vector<wire::Gap> merged;
  for (const auto& g : s->gaps) {
    if (!merged.empty() && merged.back().end == g.first && merged.back().reason == g.reason) {
      merged.back().end = g.end;
    } else {
      merged.push_back(g);
    }
  }
  s->gaps = std::move(merged);
  s->known = true;
  last_ = std::chrono::steady_clock::now();
  return DecodeError::ok;
}

DecodeError StreamTracker::on_end_of_stream(const wire::Header& h, const wire::EndOfStream& eos) {
  std::lock_guard lock(mu_);
  Stream* s = find_or_add(h.stream_id);
  if (!s) return DecodeError::too_many_streams;
  // The total cannot be below what the stream already holds (a forged end would publish a
  // truncated file as complete), nor differ between the stream's connections.
  if (eos.total_chunks > SeqSet::kMaxSeq) return DecodeError::out_of_window;
  if (eos.total_chunks < std::max(s->highest, s->settled.end()))
    return DecodeError::contradicts_stream;
  if (s->eos && s->eos->total_chunks != eos.total_chunks) return DecodeError::contradicts_stream;
  if (s->connections != 0 && s->connections != h.connections)
    return DecodeError::contradicts_stream;
  if (eos.total_chunks - s->settled.floor() > window_) return DecodeError::out_of_window;
  last_ = std::chrono::steady_clock::now();
  s->known = true;
  s->connections = h.connections;
  s->ended.insert(h.connection);
  s->eos = eos;
  return DecodeError::ok;
}

void StreamTracker::on_frame(std::uint32_t stream, std::size_t wire_bytes) {
  std::lock_guard lock(mu_);
  must(stream).wire_bytes += wire_bytes;
  last_ = std::chrono::steady_clock::now();
}

StreamTracker::Verdict StreamTracker::on_chunk(std::uint32_t stream, std::uint64_t seq, bool ok,
                                               std::size_t raw_bytes) {
  std::lock_guard lock(mu_);
  Stream& s = must(stream);
  last_ = std::chrono::steady_clock::now();
  if (s.settled.contains(seq) || !s.settled.fits(seq)) {
    ++s.duplicates;
    return Verdict::duplicate;
  }
  s.highest = std::max(s.highest, seq + 1);
  // A corrupt chunk is settled too: it is counted, acknowledged, and never waited for.
  s.settled.insert(seq);
  if (!ok) {
    ++s.corrupt;
    if (s.corrupt_seqs.size() < kMaxGaps) s.corrupt_seqs.push_back(seq);
    return Verdict::corrupt;
  }
  ++s.delivered;
  s.raw_bytes += raw_bytes;
  return Verdict::delivered;
}

bool StreamTracker::resumed(std::uint32_t stream) const {
  std::lock_guard lock(mu_);
  auto it = streams_.find(stream);
  return it != streams_.end() && it->second.before > 0;
}

std::uint64_t StreamTracker::past_gaps(std::uint32_t stream, std::uint64_t seq) const {
  std::lock_guard lock(mu_);
  auto it = streams_.find(stream);
  if (it == streams_.end()) return seq;
  for (const auto& g : it->second.gaps) {  // ascending, disjoint
    if (g.first <= seq && seq < g.end) seq = g.end;
  }
  return seq;
}

void StreamTracker::on_unwritten(std::uint32_t stream, std::uint64_t /*seq*/) {
  std::lock_guard lock(mu_);
  ++must(stream).unwritten;
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
    t.declared_missing += s.declared;
    t.raw_bytes += s.raw_bytes;
    t.wire_bytes += s.wire_bytes;
    t.complete = t.complete && s.complete();
    t.bounded = t.bounded || s.bounded();
  }
  return t;
}

std::optional<wire::EndOfStream> StreamTracker::end_of_stream(std::uint32_t stream) const {
  std::lock_guard lock(mu_);
  auto it = streams_.find(stream);
  if (it == streams_.end()) return std::nullopt;
  return it->second.eos;
}

std::vector<std::string> StreamTracker::last_gaps(std::size_t n) const {
  std::lock_guard lock(mu_);
  std::vector<std::string> out;
  for (const auto& [id, s] : streams_) {
    for (const auto& g : s.gaps) {
      out.push_back("stream " + std::to_string(id) + ": chunks " + std::to_string(g.first) +
                    (g.size() > 1 ? "-" + std::to_string(g.end - 1) : std::string()) + " (" +
                    std::string(wire::gap_reason_name(g.reason)) + ")");
    }
  }
  if (out.size() > n) out.erase(out.begin(), out.end() - static_cast<std::ptrdiff_t>(n));
  return out;
}

std::vector<wire::Gap> StreamTracker::gaps(std::uint32_t stream) const {
  std::lock_guard lock(mu_);
  auto it = streams_.find(stream);
  return it == streams_.end() ? std::vector<wire::Gap>{} : it->second.gaps;
}

std::size_t StreamTracker::held_bytes() const {
  std::lock_guard lock(mu_);
  std::size_t n = 0;
  for (const auto& [id, s] : streams_) {
    n += s.settled.bitmap_bytes() + s.resumed.bitmap_bytes() + s.gaps.size() * sizeof(wire::Gap);
  }
  return n;
}

nlohmann::json StreamTracker::streams_json(std::size_t max_ranges) const {
  std::lock_guard lock(mu_);
  nlohmann::json out = nlohmann::json::array();
  auto range = [](std::uint64_t first, std::uint64_t last) {
    return first == last ? std::to_string(first)
                         : std::to_string(first) + "-" + std::to_string(last);
  };
  for (const auto& [id, s] : streams_) {
    // Missing: the declared gaps, the holes in the window, and what never came after it.
    std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;  // [first, end)
    for (const auto& g : s.gaps) ranges.emplace_back(g.first, g.end);
    for (auto q : s.corrupt_seqs) ranges.emplace_back(q, q + 1);
    const std::uint64_t expected = s.expected();
    const std::uint64_t top = std::min(expected, s.settled.end());
    for (std::uint64_t seq = s.settled.floor();
         seq < top && ranges.size() < max_ranges + s.gaps.size() + s.corrupt_seqs.size();) {
      if (s.settled.contains(seq)) {
        ++seq;
        continue;
      }
      std::uint64_t end = seq + 1;
      while (end < top && !s.settled.contains(end)) ++end;
      ranges.emplace_back(seq, end);
      seq = end;
    }
    const std::uint64_t tail = std::max(s.settled.floor(), s.settled.end());
    if (tail < expected) ranges.emplace_back(tail, expected);
    std::sort(ranges.begin(), ranges.end());
    nlohmann::json missing = nlohmann::json::array();
    for (std::size_t i = 0; i < ranges.size() && missing.size() < max_ranges; ++i) {
      std::uint64_t first = ranges[i].first, end = ranges[i].second;
      while (i + 1 < ranges.size() && ranges[i + 1].first <= end)
        end = std::max(end, ranges[++i].second);
      missing.push_back(range(first, end - 1));
    }
    nlohmann::json gaps = nlohmann::json::array();
    for (const auto& g : s.gaps) {
      if (gaps.size() >= max_ranges) break;
      gaps.push_back({{"first", g.first},
                      {"last", g.end - 1},
                      {"chunks", g.size()},
                      {"reason", std::string(wire::gap_reason_name(g.reason))}});
    }
    out.push_back(
        {{"stream_id", id},
         {"complete", s.complete()},
         {"expected_chunks", s.eos ? nlohmann::json(s.eos->total_chunks) : nlohmann::json(nullptr)},
         {"delivered", s.delivered},
         {"delivered_before", s.before},
         {"lost", s.lost()},
         {"declared_missing", s.declared},
         {"lost_is_bound", s.bounded()},
         {"corrupt", s.corrupt},
         {"duplicates", s.duplicates},
         {"unwritten", s.unwritten},
         {"connections_ended", s.ended.size()},
         {"connections", s.connections},
         {"missing", missing},
         {"gaps", gaps}});
    // A named pipeline's stream: its name and the id it has there.
    if (auto name = names_.of(id); !name.origin.empty()) {
      out.back()["origin"] = name.origin;
      out.back()["origin_stream_id"] = name.stream;
    }
  }
  return out;
}

}  // namespace numastream
