#include "store/direct_io.hpp"

#include <fcntl.h>
#include <hdf5.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <type_traits>
#include <vector>

#include "base/error.hpp"
#include "store/undo_journal.hpp"

namespace numastream::hdf5 {
static_assert(std::is_same_v<Id, hid_t>,
              "HDF5's hid_t is a 64-bit signed integer (HDF5 1.10 and later)");

namespace {

constexpr haddr_t kMaxAddr = (static_cast<haddr_t>(1) << (8 * sizeof(off_t) - 1)) - 1;

haddr_t align_down(haddr_t a) { return a / kDirectAlign * kDirectAlign; }
haddr_t align_up(haddr_t a) { return (a + kDirectAlign - 1) / kDirectAlign * kDirectAlign; }

struct AlignedFree {
  void operator()(std::byte* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<std::byte[], AlignedFree>;

AlignedBuffer aligned(std::size_t bytes) {
  void* p = std::aligned_alloc(kDirectAlign, bytes);
  if (!p) throw std::bad_alloc();
  std::memset(p, 0, bytes);
  return AlignedBuffer(static_cast<std::byte*>(p));
}

// Fails the driver call: HDF5's error stack gets what failed and the system's reason (the
// innermost message, which the writer names in its own error).
herr_t failed(H5E_minor_t minor, const std::string& what, int err) {
  const std::string msg = what + ": " + errno_text(err);
  H5Epush2(H5E_DEFAULT, __FILE__, "numastream direct driver", __LINE__, H5E_ERR_CLS, H5E_VFL, minor,
           "%s", msg.c_str());
  return -1;
}

// What file_access() asks of the driver (its "info": HDF5 copies fapl_size bytes of it).
struct Options {
  bool direct = true;  // O_DIRECT where the filesystem takes it
  bool undo = false;   // an undo journal beside the file (undo_journal.hpp)
};

struct DirectFile {
  H5FD_t pub;  // HDF5's part; first, as every driver's
  int fd = -1;
  bool direct = false;
  std::unique_ptr<UndoJournal> undo;  // with Options::undo, for a file opened to write
  bool writable = false;
  dev_t dev = 0;
  ino_t ino = 0;
  haddr_t eoa = 0;
  haddr_t eof = 0;   // the file's length as HDF5 wrote it
  haddr_t phys = 0;  // the file's length on the device (a flushed partial block is padded)
  // The window: file bytes [base, base + len) held in `stage`; base is block-aligned and every
  // byte of the file at or past base is in the window (the device holds a copy of its partial
  // block at most). Only used when `direct`.
  AlignedBuffer stage;
  haddr_t base = 0;
  std::size_t len = 0;
  bool pending = false;  // the window holds bytes the device does not
  // The first write to the device that failed (its errno, what it was): the file is then left
  // as it is, so it opens as its last good flush left it (a later metadata write behind the
  // window would point past what the device holds).
  int broken = 0;
  std::string broken_what;
  AlignedBuffer bounce;  // blocks read, changed and written behind the window
  std::size_t bounce_size = 0;

  std::byte* bounce_for(std::size_t bytes) {
    if (bounce_size < bytes) {
      bounce = aligned(bytes);
      bounce_size = bytes;
    }
    return bounce.get();
  }
};

DirectFile* as_direct(H5FD_t* f) { return reinterpret_cast<DirectFile*>(f); }
const DirectFile* as_direct(const H5FD_t* f) { return reinterpret_cast<const DirectFile*>(f); }

// Whole-transfer pwrite/pread: a short transfer is continued, an error returned as errno.
int write_all(int fd, const std::byte* p, std::size_t n, haddr_t at) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(at));
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (w == 0) return EIO;
    p += w;
    n -= static_cast<std::size_t>(w);
    at += static_cast<haddr_t>(w);
  }
  return 0;
}

// Reads [at, at + n); bytes past the end of the file read as zeros (as HDF5 expects).
int read_all(int fd, std::byte* p, std::size_t n, haddr_t at) {
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(at));
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (r == 0) {
      std::memset(p, 0, n);
      return 0;
    }
    p += r;
    n -= static_cast<std::size_t>(r);
    at += static_cast<haddr_t>(r);
  }
  return 0;
}

std::string range(haddr_t at, std::size_t n) {
  return std::to_string(n) + " bytes at offset " + std::to_string(at);
}

herr_t write_failed(DirectFile* f, const std::string& what, int err) {
  f->broken = err;
  f->broken_what = what;
  return failed(H5E_WRITEERROR, what, err);
}

// Refuses to change a file after a write to it failed.
herr_t refuse_if_broken(DirectFile* f) {
  if (!f->broken) return 0;
  return failed(H5E_WRITEERROR,
                "an earlier write (" + f->broken_what + ") failed, the file is left as it was",
                f->broken);
}

// Writes the window's whole blocks (and, with `pad`, its partial last block, zero-padded) and
// keeps only the partial block in it.
herr_t drain(DirectFile* f, bool pad) {
  if (!f->pending) return 0;
  const std::size_t whole = static_cast<std::size_t>(align_down(f->len));
  const std::size_t out = pad ? static_cast<std::size_t>(align_up(f->len)) : whole;
  if (out == 0) return 0;
  if (out > f->len)
    std::memset(f->stage.get() + f->len, 0, out - f->len);  // padding: bytes past len are stale
  if (int err = write_all(f->fd, f->stage.get(), out, f->base))
    return write_failed(f, "write " + range(f->base, out), err);
  f->phys = std::max(f->phys, f->base + out);
  if (whole > 0) {
    const std::size_t rest = f->len - whole;
    std::memmove(f->stage.get(), f->stage.get() + whole, rest);
    f->base += whole;
    f->len = rest;
  }
  f->pending = !pad && f->len > 0;
  return 0;
}

// The window starts at the block holding `at`; that block's bytes before `at` are read from the
// device.
herr_t load_window(DirectFile* f, haddr_t at) {
  f->base = align_down(at);
  f->len = static_cast<std::size_t>(at - f->base);
  if (f->len == 0) return 0;
  if (int err = read_all(f->fd, f->stage.get(), kDirectAlign, f->base)) {
    return failed(H5E_READERROR, "read " + range(f->base, kDirectAlign), err);
  }
  std::memset(f->stage.get() + f->len, 0, kDirectAlign - f->len);
  return 0;
}

// Reads or changes [at, at + n) behind the window, whole blocks at a time.
herr_t behind_window(DirectFile* f, haddr_t at, std::size_t n, std::byte* read_into,
                     const std::byte* write_from) {
  while (n > 0) {
    const haddr_t first = align_down(at);
    const std::size_t piece =
        static_cast<std::size_t>(std::min<haddr_t>(n, first + kDirectWindow - at));
    const std::size_t span = static_cast<std::size_t>(align_up(at + piece) - first);
    std::byte* b = f->bounce_for(span);
    if (int err = read_all(f->fd, b, span, first))
      return failed(H5E_READERROR, "read " + range(first, span), err);
    if (read_into) {
      std::memcpy(read_into, b + (at - first), piece);
      read_into += piece;
    } else {
      std::memcpy(b + (at - first), write_from, piece);
      if (int err = write_all(f->fd, b, span, first))
        return write_failed(f, "write " + range(first, span), err);
      f->phys = std::max(f->phys, first + span);
      write_from += piece;
    }
    at += piece;
    n -= piece;
  }
  return 0;
}

// The journal of a file made under a temporary name `X.new` (and renamed X once its structure is
// written, as series files are) is X's: `X.undo`.
std::string journaled_name(const std::string& name) {
  constexpr std::string_view kNew = ".new";
  if (name.size() > kNew.size() && name.compare(name.size() - kNew.size(), kNew.size(), kNew) == 0)
    return name.substr(0, name.size() - kNew.size());
  return name;
}

H5FD_t* open_file(const char* name, unsigned flags, hid_t fapl, haddr_t maxaddr) {
  int o = (flags & H5F_ACC_RDWR) ? O_RDWR : O_RDONLY;
  if (flags & H5F_ACC_TRUNC) o |= O_TRUNC;
  if (flags & H5F_ACC_CREAT) o |= O_CREAT;
  if (flags & H5F_ACC_EXCL) o |= O_EXCL;
  if (maxaddr == 0 || maxaddr > kMaxAddr) maxaddr = kMaxAddr;
  Options opts;
  if (const auto* given = static_cast<const Options*>(H5Pget_driver_info(fapl))) opts = *given;
  bool direct = opts.direct;
  int fd = direct ? ::open(name, o | O_DIRECT | O_CLOEXEC, 0666) : -1;
  if (!direct || (fd < 0 && errno == EINVAL)) {  // asked not to, or the filesystem refuses it
    direct = false;
    fd = ::open(name, o | O_CLOEXEC, 0666);
  }
  if (fd < 0) {
    failed(H5E_CANTOPENFILE, std::string("open ") + name, errno);
    return nullptr;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    failed(H5E_CANTOPENFILE, std::string("stat ") + name, errno);
    ::close(fd);
    return nullptr;
  }
  auto f = std::make_unique<DirectFile>();
  std::memset(&f->pub, 0, sizeof f->pub);
  f->fd = fd;
  f->direct = direct;
  f->writable = (flags & H5F_ACC_RDWR) != 0;
  f->dev = st.st_dev;
  f->ino = st.st_ino;
  f->eof = f->phys = static_cast<haddr_t>(st.st_size);
  try {
    if (opts.undo && f->writable)
      f->undo = std::make_unique<UndoJournal>(journaled_name(name), f->eof);
    if (direct) {
      f->stage = aligned(kDirectWindow);
      if (load_window(f.get(), f->eof) < 0) {
        ::close(fd);
        return nullptr;
      }
    }
  } catch (const std::bad_alloc&) {
    failed(H5E_CANTOPENFILE, std::string("buffer for ") + name, ENOMEM);
    ::close(fd);
    return nullptr;
  }
  return &f.release()->pub;
}

herr_t flush_file(H5FD_t* file, hid_t, hbool_t) {
  DirectFile* f = as_direct(file);
  if (f->direct) {
    if (refuse_if_broken(f) < 0 || drain(f, true) < 0) return -1;
    if (f->phys > f->eof) {
      if (::ftruncate(f->fd, static_cast<off_t>(f->eof)) != 0) {
        return write_failed(f, "cut the file back to " + std::to_string(f->eof) + " bytes", errno);
      }
      f->phys = f->eof;
    }
  }
  // Everything this flush wrote is in the file: it is what a kill is rolled back to from now on.
  if (f->undo && !f->broken) {
    if (int err = f->undo->commit(f->eof))
      return failed(H5E_WRITEERROR, "empty " + f->undo->path(), err);
  }
  return 0;
}

herr_t close_file(H5FD_t* file) {
  std::unique_ptr<DirectFile> f(as_direct(file));
  herr_t flushed = f->writable ? flush_file(file, H5P_DEFAULT, true) : 0;
  if (flushed >= 0 && f->undo) {
    if (int err = f->undo->remove())
      flushed = failed(H5E_CANTCLOSEFILE, "remove " + f->undo->path(), err);
  }
  if (::close(f->fd) != 0 && flushed >= 0) return failed(H5E_CANTCLOSEFILE, "close", errno);
  return flushed;
}

int compare(const H5FD_t* a, const H5FD_t* b) {
  const DirectFile* x = as_direct(a);
  const DirectFile* y = as_direct(b);
  if (x->dev != y->dev) return x->dev < y->dev ? -1 : 1;
  if (x->ino != y->ino) return x->ino < y->ino ? -1 : 1;
  return 0;
}

herr_t query(const H5FD_t*, unsigned long* flags) {
  // As HDF5's own POSIX driver: metadata gathered into larger writes, small raw data aggregated.
  if (flags) {
    *flags = H5FD_FEAT_AGGREGATE_METADATA | H5FD_FEAT_ACCUMULATE_METADATA | H5FD_FEAT_DATA_SIEVE |
             H5FD_FEAT_AGGREGATE_SMALLDATA;
  }
  return 0;
}

haddr_t get_eoa(const H5FD_t* file, H5FD_mem_t) { return as_direct(file)->eoa; }

herr_t set_eoa(H5FD_t* file, H5FD_mem_t, haddr_t addr) {
  as_direct(file)->eoa = addr;
  return 0;
}

haddr_t get_eof(const H5FD_t* file, H5FD_mem_t) { return as_direct(file)->eof; }

herr_t get_handle(H5FD_t* file, hid_t, void** handle) {
  *handle = &as_direct(file)->fd;
  return 0;
}

herr_t read_file(H5FD_t* file, H5FD_mem_t, hid_t, haddr_t addr, size_t size, void* buf) {
  DirectFile* f = as_direct(file);
  auto* out = static_cast<std::byte*>(buf);
  if (!f->direct) {
    if (int err = read_all(f->fd, out, size, addr))
      return failed(H5E_READERROR, "read " + range(addr, size), err);
    return 0;
  }
  while (size > 0) {
    std::size_t n;
    if (addr < f->base) {
      n = static_cast<std::size_t>(std::min<haddr_t>(size, f->base - addr));
      if (behind_window(f, addr, n, out, nullptr) < 0) return -1;
    } else {
      const haddr_t off = addr - f->base;
      n = size;
      if (off >= f->len) {
        std::memset(out, 0, n);  // nothing was written there
      } else {
        n = static_cast<std::size_t>(std::min<haddr_t>(size, f->len - off));
        std::memcpy(out, f->stage.get() + off, n);
      }
    }
    out += n;
    addr += n;
    size -= n;
  }
  return 0;
}

// Before bytes the file held at its last flush change, they go to its undo journal.
herr_t save_for_undo(DirectFile* f, haddr_t addr, std::size_t size) {
  if (!f->undo || addr >= f->undo->committed()) return 0;
  const std::size_t n =
      static_cast<std::size_t>(std::min<haddr_t>(size, f->undo->committed() - addr));
  std::vector<std::byte> old(n);
  if (read_file(&f->pub, H5FD_MEM_DEFAULT, H5P_DEFAULT, addr, n, old.data()) < 0) return -1;
  if (int err = f->undo->save(addr, old))
    return write_failed(f, "save " + range(addr, n) + " in " + f->undo->path(), err);
  return 0;
}

herr_t write_file(H5FD_t* file, H5FD_mem_t, hid_t, haddr_t addr, size_t size, const void* buf) {
  DirectFile* f = as_direct(file);
  const auto* in = static_cast<const std::byte*>(buf);
  const haddr_t end = addr + size;
  if (refuse_if_broken(f) < 0 || save_for_undo(f, addr, size) < 0) return -1;
  if (!f->direct) {
    if (int err = write_all(f->fd, in, size, addr))
      return failed(H5E_WRITEERROR, "write " + range(addr, size), err);
  } else {
    while (size > 0) {
      std::size_t n;
      if (addr < f->base) {
        // What HDF5 wrote before reaches the device first: a file whose writer dies is always
        // what some prefix of its writes made it (HDF5's metadata never points past the device).
        if (drain(f, true) < 0) return -1;
        n = static_cast<std::size_t>(std::min<haddr_t>(size, f->base - addr));
        if (behind_window(f, addr, n, nullptr, in) < 0) return -1;
      } else {
        const haddr_t off = addr - f->base;
        if (off >= kDirectWindow) {  // past the window: write it out and move it here
          if (drain(f, true) < 0) return -1;
          f->base = align_down(addr);
          f->len = 0;
          continue;
        }
        n = static_cast<std::size_t>(std::min<haddr_t>(size, kDirectWindow - off));
        if (off > f->len)
          std::memset(f->stage.get() + f->len, 0, off - f->len);  // a gap HDF5 writes later
        std::memcpy(f->stage.get() + off, in, n);
        f->len = std::max<std::size_t>(f->len, static_cast<std::size_t>(off + n));
        f->pending = true;
        if (f->len == kDirectWindow && drain(f, false) < 0) return -1;
      }
      in += n;
      addr += n;
      size -= n;
    }
  }
  f->eof = std::max(f->eof, end);
  f->phys = f->direct ? f->phys : std::max(f->phys, end);
  return 0;
}

herr_t truncate_file(H5FD_t* file, hid_t, hbool_t) {
  // As HDF5's POSIX driver: the file's length becomes HDF5's end of allocation.
  DirectFile* f = as_direct(file);
  if (f->eoa == f->eof) return 0;
  if (f->eoa < f->eof && save_for_undo(f, f->eoa, static_cast<std::size_t>(f->eof - f->eoa)) < 0)
    return -1;
  if (f->direct && (refuse_if_broken(f) < 0 || drain(f, true) < 0)) return -1;
  if (::ftruncate(f->fd, static_cast<off_t>(f->eoa)) != 0) {
    return failed(H5E_WRITEERROR, "set the file's length to " + std::to_string(f->eoa), errno);
  }
  f->eof = f->phys = f->eoa;
  if (f->direct && f->eoa < f->base + f->len) return load_window(f, f->eoa);
  return 0;
}

herr_t lock_file(H5FD_t* file, hbool_t rw) {
  if (::flock(as_direct(file)->fd, (rw ? LOCK_EX : LOCK_SH) | LOCK_NB) != 0 && errno != ENOSYS) {
    return failed(H5E_CANTLOCKFILE, "lock the file (another process has it open)", errno);
  }
  return 0;
}

herr_t unlock_file(H5FD_t* file) {
  if (::flock(as_direct(file)->fd, LOCK_UN) != 0 && errno != ENOSYS) {
    return failed(H5E_CANTUNLOCKFILE, "unlock the file", errno);
  }
  return 0;
}

H5FD_class_t driver_class() {
  H5FD_class_t c{};
  c.name = "numastream-direct";
  c.maxaddr = kMaxAddr;
  c.fc_degree = H5F_CLOSE_WEAK;
  c.open = open_file;
  c.close = close_file;
  c.cmp = compare;
  c.query = query;
  c.get_eoa = get_eoa;
  c.set_eoa = set_eoa;
  c.get_eof = get_eof;
  c.get_handle = get_handle;
  c.read = read_file;
  c.write = write_file;
  c.flush = flush_file;
  c.truncate = truncate_file;
  c.fapl_size = sizeof(Options);
  c.lock = lock_file;
  c.unlock = unlock_file;
  const H5FD_mem_t free_lists[H5FD_MEM_NTYPES] = H5FD_FLMAP_DICHOTOMY;  // as HDF5's POSIX driver
  std::copy(std::begin(free_lists), std::end(free_lists), c.fl_map);
  return c;
}

hid_t driver_id() {
  static const H5FD_class_t cls = driver_class();
  static hid_t id = H5FDregister(&cls);
  return id;
}

}  // namespace

Id file_access(bool direct, bool undo) {
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  if (fapl >= 0 && (direct || undo)) {
    const hid_t id = driver_id();
    const Options opts{direct, undo};
    if (id < 0 || H5Pset_driver(fapl, id, &opts) < 0) {
      H5Pclose(fapl);
      return -1;
    }
  }
  return fapl;
}

bool written_direct(Id file) {
  void* handle = nullptr;
  if (H5Fget_vfd_handle(file, H5P_DEFAULT, &handle) < 0 || !handle) return false;
  const int flags = ::fcntl(*static_cast<int*>(handle), F_GETFL);
  return flags >= 0 && (flags & O_DIRECT) != 0;
}

}  // namespace numastream::hdf5
