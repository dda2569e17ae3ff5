// Package version is the numastream release the Go binaries were built from: the repository's
// VERSION file, stamped at link time (make operator: -X .../internal/version.Version=...), and the
// source revision Go records when it builds from a git checkout.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version is set at link time; "dev" for a plain `go build`.
var Version = "dev"

// String is the line a binary prints for --version: its name, the release, the Go toolchain and,
// when known, the source revision (with "+dirty" for uncommitted changes).
func String(binary string) string {
	rev := ""
	if info, ok := debug.ReadBuildInfo(); ok {
		dirty := false
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if rev != "" && dirty {
			rev += "+dirty"
		}
	}
	if rev == "" {
		return fmt.Sprintf("%s %s (%s)", binary, Version, runtime.Version())
	}
	return fmt.Sprintf("%s %s (%s, %s)", binary, Version, runtime.Version(), rev)
}
