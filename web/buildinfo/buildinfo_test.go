package buildinfo

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRead: a test binary has no VCS stamp, but always a version and the Go release.
func TestRead(t *testing.T) {
	info := Read()
	require.NotEmpty(t, info.Version)
	require.Equal(t, runtime.Version(), info.GoVersion)
}
