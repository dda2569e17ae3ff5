// Files the agent writes for its users: their directories and their permissions.
#pragma once

#include <string>

namespace numastream {

// Creates the directories above `path` that do not exist yet, each with `file_mode` plus the
// search bit wherever it grants reading (0640 -> 0750), whatever the umask. Throws
// std::system_error naming the directory it could not make.
void make_parent_dirs(const std::string& path, unsigned file_mode);

// Parses an octal permission string ("0640", "640"): the owner reads and writes, others never
// write. Throws std::invalid_argument saying what is wrong.
unsigned parse_file_mode(const std::string& text);

}  // namespace numastream
