// Every metric the agent writes, declared once: its name, its type and its help text. The roles
// and stages that write a family read it from here (MetricRegistry::add); docs/agent-metrics.md
// describes each one, and a unit test holds the two to each other.
#pragma once

#include <array>

#include "obs/registry.hpp"

namespace numastream::metric {

inline constexpr MetricDef raw_bytes{
    "numastream_raw_bytes_total", MetricType::counter,
    "Raw (uncompressed) bytes: taken from the source (send), of the chunks received "
    "(receive)."};
inline constexpr MetricDef wire_bytes{
    "numastream_wire_bytes_total", MetricType::counter,
    "Bytes of the frames: handed to the network (send), received (receive)."};
inline constexpr MetricDef chunks_sent{"numastream_chunks_sent_total", MetricType::counter,
                                       "Frames handed to ZeroMQ (first transmissions)."};
inline constexpr MetricDef chunks_acknowledged{"numastream_chunks_acknowledged", MetricType::gauge,
                                               "Chunks of the stream the receiver has taken."};
inline constexpr MetricDef queue_depth{"numastream_queue_depth", MetricType::gauge,
                                       "Items in a stage queue."};
inline constexpr MetricDef compression_ratio{"numastream_compression_ratio", MetricType::gauge,
                                             "Raw bytes over compressed bytes so far."};
inline constexpr MetricDef spill_bytes{"numastream_spill_bytes", MetricType::gauge,
                                       "Bytes in the spill files now."};
inline constexpr MetricDef spill_max_bytes{"numastream_spill_max_bytes", MetricType::gauge,
                                           "The spill's limit (spill.max_bytes)."};
inline constexpr MetricDef spill_chunks{"numastream_spill_chunks", MetricType::gauge,
                                        "Chunks waiting in the spill."};
inline constexpr MetricDef spilled_chunks{"numastream_spilled_chunks_total", MetricType::counter,
                                          "Chunks that went through the spill."};
inline constexpr MetricDef spill_lost_chunks{"numastream_spill_lost_chunks_total",
                                             MetricType::counter,
                                             "Chunks lost because the spill was full."};
inline constexpr MetricDef streams_complete{"numastream_streams_complete", MetricType::gauge,
                                            "Streams that ended on every connection."};
inline constexpr MetricDef chunks_delivered{
    "numastream_chunks_delivered_total", MetricType::counter,
    "Chunks decompressed, verified and handed to the sink."};
inline constexpr MetricDef chunks_lost{
    "numastream_chunks_lost", MetricType::gauge,
    "Chunks missing: announced by the sender (or below the highest sequence seen) and not "
    "delivered."};
inline constexpr MetricDef chunks_declared_missing{
    "numastream_chunks_declared_missing", MetricType::gauge,
    "Of the chunks lost, those their sender declared gone (a restarted sender of a live "
    "source, a full spill)."};
inline constexpr MetricDef gaps_last{"numastream_gaps_last", MetricType::gauge,
                                     "The last declared gaps (at most 5): stream, chunks and why."};
inline constexpr MetricDef chunks_corrupt{
    "numastream_chunks_corrupt_total", MetricType::counter,
    "Chunks whose checksum or decompressed size did not match."};
inline constexpr MetricDef chunks_duplicate{"numastream_chunks_duplicate_total",
                                            MetricType::counter,
                                            "Chunks received again after they were delivered."};
inline constexpr MetricDef frames_malformed{"numastream_frames_malformed_total",
                                            MetricType::counter,
                                            "Frames rejected before decoding, by reason."};
inline constexpr MetricDef chunks_delivered_before{
    "numastream_chunks_delivered_before", MetricType::gauge,
    "Chunks an earlier instance of this receiver acknowledged (reported by resuming senders)."};
inline constexpr MetricDef acks_sent{"numastream_acks_sent_total", MetricType::counter,
                                     "Acknowledgement frames sent."};
inline constexpr MetricDef connections_rejected{
    "numastream_connections_rejected_total", MetricType::counter,
    "Connections dropped before any frame: not a ZeroMQ peer (handshake), a key that is not "
    "allowed (auth), an address outside security.allow_from (address); a Stream V2 re-emit's "
    "consumer outside its sink's allow_from (consumer)."};
inline constexpr MetricDef connections_accepted{"numastream_connections_accepted_total",
                                                MetricType::counter,
                                                "Connections accepted on the data ports."};
inline constexpr MetricDef connections_opened{
    "numastream_connections_opened_total", MetricType::counter,
    "Connections that opened a stream (sent a resume frame)."};
inline constexpr MetricDef resumes{"numastream_resumes_total", MetricType::counter,
                                   "Resume frames received (one per connection and reconnection)."};
inline constexpr MetricDef stage_chunks{"numastream_stage_chunks_total", MetricType::counter,
                                        "Chunks a stage finished."};
inline constexpr MetricDef stage_bytes{"numastream_stage_bytes_total", MetricType::counter,
                                       "Bytes into and out of a stage."};
inline constexpr MetricDef stage_busy_seconds{"numastream_stage_busy_seconds_total",
                                              MetricType::counter,
                                              "Thread-seconds a stage spent working."};
inline constexpr MetricDef stage_blocked_seconds{
    "numastream_stage_blocked_seconds_total", MetricType::counter,
    "Thread-seconds a stage waited: on an empty input (cause=input) or a full output or "
    "exhausted buffer pool (cause=output)."};
inline constexpr MetricDef stage_input_waits{
    "numastream_stage_input_waits_total", MetricType::counter,
    "Waits on an empty input by the stage's threads that spin first (placement.wait): ended "
    "while spinning (ended=spinning) or parked (ended=parked)."};
inline constexpr MetricDef thread_info{"numastream_thread_info", MetricType::gauge,
                                       "Where each pipeline thread runs (value is always 1)."};
inline constexpr MetricDef up{"numastream_up", MetricType::gauge, "0 once the pipeline failed."};
inline constexpr MetricDef nic_local{
    "numastream_nic_local", MetricType::gauge,
    "1 when every thread of the stage runs on the NIC's NUMA node, 0 when one does not, -1 "
    "when unknown."};
inline constexpr MetricDef pool_buffers_in_use{"numastream_pool_buffers_in_use", MetricType::gauge,
                                               "Buffers taken from a per-node pool."};
inline constexpr MetricDef consumer_chunks{"numastream_consumer_chunks_total", MetricType::counter,
                                           "Chunks handed to each consumer's sink (sinks)."};
inline constexpr MetricDef consumer_passed_over{
    "numastream_consumer_passed_over_total", MetricType::counter,
    "Chunks a latest-only consumer had no room for (it never holds the others back)."};
inline constexpr MetricDef consumer_behind{"numastream_consumer_behind", MetricType::gauge,
                                           "Chunks waiting in each consumer's queue."};
inline constexpr MetricDef consumer_spill_bytes{
    "numastream_consumer_spill_bytes", MetricType::gauge,
    "Bytes in each consumer's spill (sinks[].spill) not handed to its sink yet."};
inline constexpr MetricDef adaptive_active_threads{
    "numastream_adaptive_active_threads", MetricType::gauge,
    "Threads of the codec stage at work now (placement.adaptive)."};
inline constexpr MetricDef cpu_budget_changes{
    "numastream_cpu_budget_changes_total", MetricType::counter,
    "Changes of the process's CPU budget (cgroup cpuset or quota) seen while it ran."};
inline constexpr MetricDef cpu_budget_cpus{"numastream_cpu_budget_cpus", MetricType::gauge,
                                           "CPUs the process's cgroup lets it use now."};
inline constexpr MetricDef adaptive_changes{
    "numastream_adaptive_changes_total", MetricType::counter,
    "Changes of the codec stage's active threads, by move and reason."};
inline constexpr MetricDef stream2_series_completed{
    "numastream_stream2_series_completed_total", MetricType::counter,
    "Stream V2 series a gateway's sink completed (published whole, or re-emitted to their end)."};
inline constexpr MetricDef stream2_series_incomplete{
    "numastream_stream2_series_incomplete_total", MetricType::counter,
    "Stream V2 series that ended incomplete (their detector went away before the end "
    "message)."};
inline constexpr MetricDef stream2_series_incomplete_last{
    "numastream_stream2_series_incomplete_last", MetricType::gauge,
    "The last series that ended incomplete, and why."};
inline constexpr MetricDef stream2_messages_malformed{
    "numastream_stream2_messages_malformed_total", MetricType::counter,
    "Messages from the detector that were not Stream V2 (dropped)."};

inline constexpr std::array kAll{
    &raw_bytes,
    &wire_bytes,
    &chunks_sent,
    &chunks_acknowledged,
    &queue_depth,
    &compression_ratio,
    &spill_bytes,
    &spill_max_bytes,
    &spill_chunks,
    &spilled_chunks,
    &spill_lost_chunks,
    &streams_complete,
    &chunks_delivered,
    &chunks_lost,
    &chunks_declared_missing,
    &gaps_last,
    &chunks_corrupt,
    &chunks_duplicate,
    &frames_malformed,
    &chunks_delivered_before,
    &acks_sent,
    &connections_rejected,
    &connections_accepted,
    &connections_opened,
    &resumes,
    &stage_chunks,
    &stage_bytes,
    &stage_busy_seconds,
    &stage_blocked_seconds,
    &stage_input_waits,
    &thread_info,
    &up,
    &nic_local,
    &pool_buffers_in_use,
    &consumer_chunks,
    &consumer_passed_over,
    &consumer_behind,
    &consumer_spill_bytes,
    &adaptive_active_threads,
    &cpu_budget_changes,
    &cpu_budget_cpus,
    &adaptive_changes,
    &stream2_series_completed,
    &stream2_series_incomplete,
    &stream2_series_incomplete_last,
    &stream2_messages_malformed,
};

}  // namespace numastream::metric
