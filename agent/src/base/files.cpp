#include "base/files.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <stdexcept>

#include "base/error.hpp"

namespace numastream {

void make_parent_dirs(const std::string& path, unsigned file_mode) {
  const unsigned dir_mode = (file_mode | ((file_mode & 0444u) >> 2)) & 0777u;
  for (std::string::size_type slash = path.find('/', 1); slash != std::string::npos;
       slash = path.find('/', slash + 1)) {
    const std::string dir = path.substr(0, slash);
    if (::mkdir(dir.c_str(), dir_mode) == 0) {
      if (::chmod(dir.c_str(), dir_mode) != 0) throw_errno("chmod " + dir);
    } else if (errno != EEXIST) {
      throw_errno("mkdir " + dir);
    }
  }
}

unsigned parse_file_mode(const std::string& text) {
  if (text.empty() || text.size() > 4)
    throw std::invalid_argument("must be 3 or 4 octal digits, like \"0640\"");
  unsigned mode = 0;
  for (char c : text) {
    if (c < '0' || c > '7')
      throw std::invalid_argument("must be octal digits, like \"0640\" (got \"" + text + "\")");
    mode = mode * 8 + static_cast<unsigned>(c - '0');
  }
  if (mode > 0777u)
    throw std::invalid_argument("has bits beyond the permissions (got \"" + text + "\")");
  if ((mode & 0600u) != 0600u)
    throw std::invalid_argument("must let the owner read and write (got \"" + text +
                                "\"): a resumed stream writes on");
  if (mode & 0002u) throw std::invalid_argument("must not let others write (got \"" + text + "\")");
  if (mode & 0111u)
    throw std::invalid_argument("must not make data files executable (got \"" + text + "\")");
  return mode;
}

}  // namespace numastream
