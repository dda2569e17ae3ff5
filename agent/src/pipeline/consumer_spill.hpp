// A lossless consumer's spill (config `sinks[].spill`): every chunk for the consumer is written
// there, in order, and taken for it once written (its acknowledgement joins the others'), and the
// consumer's sink thread reads them back. So the consumer holds no chunk unacknowledged, however
// long its sink takes (an onward hop's window to a far site that stopped), until the spill is
// full. What an earlier process spilled (taken for the consumer already) goes to the sink first.
// A chunk read back stays on disk until the sink has it, so a process that dies before leaves it
// to its next one. Each record carries the XXH3-64 of its payload after the frame: a chunk whose
// payload changed on disk is never handed to the sink; it is declared lost (`lost`), named in
// the log and the summary. (Records of versions before 0.2 carry none and are read unchecked.)
// Thread-safe: the decompressing threads write, the consumer's thread reads.
// Internal to the agent.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "config/config.hpp"
#include "data/spill.hpp"
#include "pipeline/chunk.hpp"
#include "pipeline/sink.hpp"

namespace numastream {

// A record of acknowledged chunks (everything below `floor`, and `above`) without the sequences
// in `held`: the lowest held one at most becomes the floor, what lay below the old floor and is
// not held is listed.
std::pair<std::uint64_t, std::vector<std::uint64_t>> without_held(
    std::uint64_t floor, const std::vector<std::uint64_t>& above,
    const std::set<std::uint64_t>& held);

class ConsumerSpill {
 public:
  // Opens (or recovers) the spill of consumer `index` under `cfg.path`; `settle` takes a chunk
  // for the consumer once it is written there. `identity` names the consumer by what it writes
  // to (its kind and path or endpoint), never by its place in `sinks`: the directory keeps it,
  // and a spill another consumer left there is refused, naming both, not handed to this one's
  // sink. Its files are found by what they are named in the directory (one consumer's each).
  // `lost` hears of each chunk read back damaged (its stream and sequence).
  using LostFn = std::function<void(std::uint32_t stream, std::uint64_t seq)>;
  ConsumerSpill(const SpillConfig& cfg, std::uint32_t index, const std::string& identity,
                AckFn settle, LostFn lost = {});

  // Writes `c` (waiting while the spill is full: this consumer then holds the others back);
  // false, nothing written, once `closing()` says the run is closing.
  bool put(Chunk& c, const std::function<bool()>& closing);
  // The oldest chunk in the spill, waiting at most `wait` for one: via -1, or -2 for an earlier
  // process's (taken for the consumer already). `max_payload` bounds a frame read back.
  std::optional<Chunk> take(std::chrono::milliseconds wait, std::size_t max_payload);
  // The consumer's sink took (or passed as had) a chunk that came from the spill (via < 0).
  void taken(int via, std::uint32_t stream, std::uint64_t seq);
  // The spill still owes its sink chunks of `stream` (or an earlier process's, stream unknown).
  bool owes(std::uint32_t stream);
  // What the spill holds of `stream` for its sink (written, this process's or an earlier's, and
  // not taken by the sink yet), taken out of an acknowledged record of the stream: what the
  // consumer itself has had.
  std::pair<std::uint64_t, std::vector<std::uint64_t>> had(std::uint32_t stream,
                                                           std::uint64_t floor,
                                                           const std::vector<std::uint64_t>& above);
  // Chunks an earlier process spilled.
  std::uint64_t recovered() const { return store_->recovered().frames; }
  std::uint64_t pending_bytes() const noexcept { return pending_bytes_.load(); }
  // The figures of a consumer's summary (its "spill" object).
  nlohmann::json report() const;

 private:
  // Per stream, the sequences the spill holds for its sink (filled while store_ recovers).
  std::map<std::uint32_t, std::set<std::uint64_t>> holding_;
  std::unique_ptr<SpillStore> store_;
  AckFn settle_;
  LostFn lost_;
  mutable std::mutex mu_;          // guards the store and what follows
  std::condition_variable room_;   // space came back
  std::condition_variable ready_;  // a chunk was written
  std::atomic<std::uint64_t> spilled_{0};
  std::atomic<std::uint64_t> peak_bytes_{0};
  std::atomic<std::uint64_t> pending_bytes_{0};  // in the spill, not read out yet
  // What the spill owes its sink: chunks spilled, per stream, that the sink has not taken yet,
  // and an earlier process's (their streams are known once read: via -2).
  std::map<std::uint32_t, std::uint64_t> owed_;
  std::uint64_t recovered_owed_ = 0;
  std::uint64_t recovered_unread_ = 0;
  // Chunks read out of the spill, held there (SpillStore::read's token) until the sink has them.
  std::multimap<std::pair<std::uint32_t, std::uint64_t>, std::uint64_t> held_;
  std::uint64_t damaged_ = 0;              // chunks read back damaged, declared lost
  std::vector<std::string> damaged_last_;  // the last of them, named
  // Drops a record read back whose payload is not what was written: the sink never has it.
  void declare_damaged(const wire::Header& h, std::uint64_t token, bool recovered);
};

}  // namespace numastream
