// Package static holds the dashboard's stylesheet, script and icon, embedded into the binary
// so a deployment is one file and no page depends on a CDN.
package static

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"sync"
)

//go:embed *.css *.js *.svg
var files embed.FS

// FS is the embedded assets, served under Prefix.
var FS fs.FS = files

// Prefix is the URL path the assets are served under.
const Prefix = "/static/"

var versions = sync.OnceValue(func() map[string]string {
	v := map[string]string{}
	entries, _ := fs.ReadDir(files, ".")
	for _, e := range entries {
		b, err := fs.ReadFile(files, e.Name())
		if err != nil {
			continue
		}
		sum := sha256.Sum256(b)
		v[e.Name()] = hex.EncodeToString(sum[:])[:12]
	}
	return v
})

// Version returns a short content hash of the asset name, or "" if there is no such asset.
func Version(name string) string { return versions()[name] }

// URL returns the URL of the asset name with its content hash as a cache buster, so the
// asset can be cached for a year and still change with each release.
func URL(name string) string {
	if v := Version(name); v != "" {
		return Prefix + name + "?v=" + v
	}
	return Prefix + name
}
