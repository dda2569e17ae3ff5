package nodedaemon

import (
	"io/fs"
	"syscall"
)

func ownedBy(info fs.FileInfo, uid, gid int64) bool {
	st, ok := info.Sys().(*syscall.Stat_t)
	return ok && int64(st.Uid) == uid && int64(st.Gid) == gid
}
