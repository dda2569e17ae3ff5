// An undo journal: what makes an HDF5 file's flush all-or-nothing for a writer that is killed.
// HDF5 rewrites its metadata in place, in an order of its own, so a process killed in the middle
// of a flush can leave a file whose objects do not read back. The file driver (direct_io.hpp)
// keeps, beside a file written with `undo`, the journal `<file>.undo`: before it overwrites any
// byte the file held at its last flush, the bytes there go to the journal; each flush that
// completes empties it. A file found with a journal that is not empty is rolled back to its last
// flush: the saved bytes written back (the last saved first), the file cut to its length then.
//
// Journal: a header (the magic "NSUNDO1\n", the file's length at its last flush), then records
// (offset, length, a check of the three, the bytes), each written with one pwrite before the
// write it undoes. A record cut short or failing its check (a crash mid-write, not a kill) ends
// the journal: the write it would undo had not begun. Every integer little-endian, 8 bytes.
// Consistent after a kill (what a process wrote is in the page cache); after a power cut, what
// HDF5 writes is not either. Internal to the agent.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace numastream::hdf5 {

class UndoJournal {
 public:
  // The journal of file `file` (at `file`.undo), not created before its first save().
  // `committed`: the file's length at its last flush (as opened: its length).
  UndoJournal(std::string file, std::uint64_t committed) noexcept;
  ~UndoJournal();
  UndoJournal(const UndoJournal&) = delete;
  UndoJournal& operator=(const UndoJournal&) = delete;

  // The length the file had at its last flush: bytes below it are saved before they change.
  std::uint64_t committed() const noexcept { return committed_; }
  // Saves the bytes `old` the file holds at `offset` (below committed()), before they change.
  // 0, or the errno of what failed.
  int save(std::uint64_t offset, std::span<const std::byte> old);
  // A flush completed: the file is what it will be rolled back to, `length` bytes long.
  int commit(std::uint64_t length);
  // The file is closed whole: the journal goes.
  int remove();
  const std::string& path() const noexcept { return path_; }

  // Rolls `file` back to its last flush if its journal says a flush did not complete; removes
  // the journal. What it did, for the log ("" when there was nothing to undo). Throws
  // std::runtime_error naming the file when it cannot.
  static std::string roll_back(const std::string& file);

 private:
  std::string path_;
  std::uint64_t committed_;
  int fd_ = -1;
  std::uint64_t end_ = 0;  // bytes in the journal
};

}  // namespace numastream::hdf5
