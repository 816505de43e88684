// Package buildinfo says which build of idemgate is running: the module version and the
// version-control stamp the Go toolchain embeds (runtime/debug.ReadBuildInfo), for
// `idemgate version` and the idemgate_build_info metric.
package buildinfo

import (
	"runtime"
	"runtime/debug"
	"sync"
)

// Info describes the running binary. Fields the toolchain did not record are "" (Revision and
// Time are stamped only when the binary is built from a VCS checkout, e.g. `go build`, not
// `go test`; Version is "(devel)" for a build from a checkout rather than `go install
// module@version`).
type Info struct {
	Version   string // module version, e.g. "v1.4.0" or "(devel)"
	Revision  string // VCS revision (a git commit hash)
	Time      string // commit time of Revision, RFC 3339
	Modified  bool   // the checkout had uncommitted changes when it was built
	GoVersion string // Go release the binary was built with, e.g. "go1.27.3"
}

// Read returns the running binary's Info; it reads the embedded build information once.
var Read = sync.OnceValue(func() Info {
	info := Info{Version: "(devel)", GoVersion: runtime.Version()}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return info
	}
	if bi.Main.Version != "" {
		info.Version = bi.Main.Version
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			info.Revision = s.Value
		case "vcs.time":
			info.Time = s.Value
		case "vcs.modified":
			info.Modified = s.Value == "true"
		}
	}
	return info
})
