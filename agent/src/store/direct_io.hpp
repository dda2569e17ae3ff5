// HDF5 files written without the page-cache copy: an HDF5 file driver of our own that opens the
// file with O_DIRECT (Debian's libhdf5 1.10 is built without HDF5's direct driver). Writes land
// in one aligned buffer per file (a window of the file's tail, where HDF5 appends frames) that
// goes to the device a whole number of blocks at a time; a write behind the window (HDF5's
// metadata, rewritten at each flush) reads, changes and writes the blocks it touches. A flush
// writes the window's last partial block too, padded, and cuts the file back to its length, so
// what a flush returned from is on the device and an HDF5 reader (h5py, h5dump, any driver) opens
// the file as if HDF5's own driver had written it.
//
// Where the filesystem refuses O_DIRECT (ramfs, some FUSE and network filesystems) the file is
// opened as HDF5's default driver would open it and written through the page cache: nothing else
// changes. written_direct() says which happened. Internal to the agent; one thread at a time uses a
// file.
#pragma once

#include <cstddef>
#include <cstdint>

namespace numastream::hdf5 {

// Bytes each O_DIRECT transfer is aligned to (file offset, length, memory): a multiple of every
// logical block size in use (512 and 4096).
inline constexpr std::size_t kDirectAlign = 4096;
// The window of a file's tail held in memory: each write to the device is at most this long.
inline constexpr std::size_t kDirectWindow = 8u << 20;

// HDF5 identifiers (hid_t) as this header passes them, without HDF5's headers.
using Id = std::int64_t;

// A file-access property list: our driver when `direct` (O_DIRECT) or `undo` (an undo journal
// beside each file opened to write, undo_journal.hpp), HDF5's default otherwise; -1 when it
// cannot be set up. The caller closes it (H5Pclose).
Id file_access(bool direct, bool undo = false);

// Whether the open file `file` writes past the page cache (its descriptor has O_DIRECT).
bool written_direct(Id file);

}  // namespace numastream::hdf5
