// The sender's spill: chunks the receiver cannot take yet, from a source that cannot wait, kept
// on node-local storage and sent in order once it catches up (sender.hpp).
#include "pipeline/sender.hpp"

namespace numastream {

// The spill (cfg.spill): what a live source's earlier sender left in it goes first.
void Sender::open_spill() {
  if (!cfg_.spill.enabled()) return;
  // A live source's earlier sender may have left chunks in the spill it never sent: they go
  // first, in order, under their own sequence numbers. A replaying source sends them again
  // from the source instead.
  SpillStore::Recover recover;
  if (!source_->replays()) {
    recover = [this](std::span<const std::byte> head, std::size_t size) {
      wire::Header h;
      if (wire::decode_data_header(head, size, cfg_.chunk_bytes, h) != wire::DecodeError::ok ||
          h.stream_id != cfg_.stream_id ||
          (!records_.recovered.empty() && h.sequence <= records_.recovered.back())) {
        return false;
      }
      records_.recovered.push_back(h.sequence);
      return true;
    };
  }
  spill_.store =
      std::make_unique<SpillStore>(cfg_.spill.path, cfg_.stream_id, cfg_.spill.max_bytes, recover);
  if (const auto& r = spill_.store->recovered(); r.frames > 0 || !r.why_dropped.empty()) {
    log_line("spill: " + std::to_string(r.frames) + " chunks (" + std::to_string(r.bytes) +
             " bytes) an earlier sender "
             "spilled are sent first" +
             (r.frames > 0 ? ", chunks " + std::to_string(records_.recovered.front()) + ".." +
                                 std::to_string(records_.recovered.back())
                           : std::string()) +
             (r.why_dropped.empty()
                  ? std::string()
                  : "; " + std::to_string(r.dropped_bytes) + " bytes after " + r.why_dropped +
                        " are dropped (their chunks are declared missing)"));
  }
  spill_.queue = std::make_unique<BoundedQueue<Chunk>>(static_cast<std::size_t>(cfg_.queue_depth));
  log_line("spill: up to " + std::to_string(cfg_.spill.max_bytes) + " bytes in " + cfg_.spill.path +
           (source_can_wait()
                ? " (the source waits when it is full)"
                : " (the source cannot wait: what a full spill refuses is lost and counted)"));
}

// Moves spilled frames, oldest first, to the sending threads' queue: while it has room, or (wait)
// all of them, waiting for room. False once the run is closing.
bool Sender::unspill(BufferPool& pool, bool wait) {
  while (!spill_.store->empty()) {
    if (!wait && spill_.queue->depth() >= spill_.queue->capacity()) return true;
    Chunk c;
    c.buffer = pool.take();
    if (!c.buffer) return false;
    const std::size_t n = spill_.store->read({c.buffer->data, c.buffer->capacity});
    c.buffer->size = n;
    if (wire::decode({c.buffer->data, n}, cfg_.chunk_bytes, c.header) != wire::DecodeError::ok) {
      throw std::runtime_error("spill: a frame read back from " + spill_.store->dir() +
                               " is damaged");
    }
    spill_.disk_bytes = spill_.store->disk_bytes();
    spill_.frames = spill_.store->frames();
    // An earlier sender's: it may have been sent and acknowledged before that sender stopped.
    if (ledger_->contains(cfg_.stream_id, c.header.sequence)) continue;
    c.header.connections = static_cast<std::uint16_t>(cfg_.connections);
    if (!spill_.queue->push(c)) return false;
  }
  return true;
}

// The chunks in order from the compressors to the sending threads. While the sending threads
// keep up, a chunk goes straight on; once their queue is full (the network, the receiver or its
// sink is behind), chunks go to the spill store instead, and every later chunk after them, until
// the store has drained into the queue again: the order on the wire never changes, and memory
// holds no more than the pools. A full store holds a source that can wait back; for any other,
// the chunk is lost, counted, and reported (the receiver reports the gap too).
void Sender::spill_loop() {
  BufferPool& pool = wire_pools_->for_node(rt_.placement.stage(Stage::send).front().numa_node);
  const bool can_wait = source_can_wait();
  if (!wait_welcome()) return;  // the receiver's answer says which recovered chunks it has
  while (true) {
    if (!unspill(pool, false)) return;
    bool done = false;
    std::optional<Chunk> c =
        wire_q_->pop_for(std::chrono::milliseconds(spill_.store->empty() ? 50 : 5), done);
    if (!c) {
      if (done) break;
      continue;
    }
    if (spill_.store->empty() && spill_.queue->try_push(*c)) continue;
    const std::size_t frame_size = wire::kHeaderSize + c->header.payload_size;
    bool appended;
    if (c->body) {
      std::byte head[wire::kHeaderSize];
      wire::encode_header(c->header, head);
      appended = spill_.store->append({head, sizeof(head)}, c->payload());
    } else {
      c->seal();
      appended = spill_.store->append({c->buffer->data, c->buffer->size});
    }
    if (appended) {
      if (spill_.chunks++ == 0)
        log_warn("spill: the sending threads fell behind; spilling to " + spill_.store->dir());
      spill_.bytes += frame_size;
      spill_.disk_bytes = spill_.store->disk_bytes();
      spill_.frames = spill_.store->frames();
      spill_.peak_bytes = std::max(spill_.peak_bytes.load(), spill_.store->disk_bytes());
      continue;
    }
    if (can_wait) {
      // Full: the source waits while the spill drains, then this chunk follows it.
      if (!unspill(pool, true) || !spill_.queue->push(*c)) return;
      continue;
    }
    // Declared: the receiver counts it missing and names it, and does not wait for it.
    const wire::Gap gap{c->header.sequence, c->header.sequence + 1, wire::GapReason::spill_full};
    if (!gap_book_->add(cfg_.stream_id, {&gap, 1})) {
      throw std::runtime_error("spill: more than " + std::to_string(wire::kMaxDeclaredGaps) +
                               " separate runs of chunks refused by the full spill");
    }
    ledger_->settle(cfg_.stream_id, {&gap, 1});
    if (spill_.store->disk_full()) ++spill_.disk_full;
    if (spill_.lost++ == 0 || (spill_.store->disk_full() && spill_.disk_full == 1)) {
      log_line("spill: " +
               (spill_.store->disk_full()
                    ? "no space left on the device of " + spill_.store->dir() + " (" +
                          std::to_string(spill_.store->disk_bytes()) +
                          " bytes spilled, max_bytes " + std::to_string(spill_.store->max_bytes()) +
                          ")"
                    : "full (" + std::to_string(spill_.store->disk_bytes()) + " of " +
                          std::to_string(spill_.store->max_bytes()) + " bytes in " +
                          spill_.store->dir() + ")") +
               ": chunk " + std::to_string(c->header.sequence) +
               " lost, and every chunk the spill refuses from now on is counted lost");
    }
  }
  // The compressors are done: what is spilled follows, in order.
  if (!unspill(pool, true)) return;
  spill_.queue->close();
}

}  // namespace numastream
