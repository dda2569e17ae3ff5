// A gateway's relay (config `relay`): the frames its receiving threads took go on undecoded, in
// order per stream (a reorder window, declared gaps not waited for), over one acknowledged link
// (net/link.hpp) to the decompressing side beside it; what that side acknowledges goes back to
// every upstream connection, a discard named as one. The streams' control frames come in order
// with the data: a resume frame announces the stream downstream, gaps and metadata are passed on.
// When the input ends, each stream is ended downstream with the totals its sender announced.
// Internal to the agent.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "data/queue.hpp"
#include "net/link.hpp"
#include "net/transport.hpp"
#include "pipeline/inbound.hpp"
#include "pipeline/runtime.hpp"
#include "pipeline/sink.hpp"
#include "wire/tracker.hpp"

namespace numastream {

// What the relay shares with the gateway's receiving stage.
struct RelayWiring {
  Runtime& rt;
  zmq::Context& ctx;
  LinkOptions link;                                // to the decompressing side
  BoundedQueue<Inbound>& input;                    // from the receiving threads
  StreamTracker& tracker;                          // duplicates, declared gaps
  std::shared_ptr<AckLedger> ledger;               // what the decompressing side acknowledged
  std::shared_ptr<GapBook> gaps;                   // declared downstream
  std::vector<std::unique_ptr<AckBox>>& upstream;  // acknowledgements, per receiving thread
  std::size_t reorder_window;
  // A stream's end frame after `count` frames; none before its sender ended it.
  std::function<std::optional<zmq::Message>(std::uint32_t stream, std::uint64_t count)> end;
  std::atomic<std::int64_t>& last_ns;  // when the last chunk went on (since the run started)
};

// The relay stage's thread body: runs until the input ends (or the run aborts).
void run_relay(const RelayWiring& w, StageThread& t);

}  // namespace numastream
