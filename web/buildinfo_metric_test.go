package web

import (
	"runtime"
	"testing"

	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/web/buildinfo"
	"github.com/stretchr/testify/require"
)

// TestBuildInfoMetric: every scrape carries idemgate_build_info 1 with the binary's version,
// revision and Go release as labels.
func TestBuildInfoMetric(t *testing.T) {
	dbs.Each(t, func(t *testing.T, db *models.DB) {
		s := newTestServer(t, db)
		sc := scrapeMetrics(t, s)
		info := buildinfo.Read()
		series := sc.series("idemgate_build_info")
		require.Len(t, series, 1)
		for labels, v := range series {
			require.Equal(t, 1.0, v)
			require.Contains(t, labels, "goversion="+runtime.Version())
			require.Contains(t, labels, "version="+info.Version)
			require.Contains(t, labels, "revision=")
		}
	})
}
