// Opening cache roots and their shard directories, with the trust rules:
//   - the writable root and its shards must be directories owned by this
//     process's effective uid and not writable by group or others; otherwise
//     the root is not used at all (not read either: anyone who can write there
//     could plant an entry whose hash is valid);
//   - a read-only root and its shards must not be writable by others.
// Shards are opened relative to the root's descriptor and never through a
// symlink. Internal to cache/.
#pragma once

#include <string>
#include <string_view>

#include "posix_io.hpp"

namespace kjit::cache::detail {

enum class RootRole { writable, read_only };

// A warning the first time `topic` is seen in this process, debug after.
void warn_once(const std::string& topic, const std::string& message);

// An existing root, checked. Absent: an error whose err is ENOENT. Untrusted:
// an error whose err is 0 and whose message says why and how to fix it.
SysExpected<Fd> open_root(const std::string& path, RootRole role);

// The writable root, created (0700, with missing parents) when absent.
SysExpected<Fd> open_root_for_writing(const std::string& path);

// The shard directory `shard` (two hex digits, see layout.hpp) inside an open
// root, checked like its root. With `create`, made (0700) when absent, and the
// root synced so that the new directory survives a crash.
SysExpected<Fd> open_shard(int root_fd, const std::string& root_path, const std::string& shard, RootRole role,
                           bool create);

// Whether an open directory of a root with `role` may be used; empty when yes.
std::string trust_problem(const struct stat& st, RootRole role);

}  // namespace kjit::cache::detail
