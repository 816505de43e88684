package proxy_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemgate/idemgate/e2e/conformance"
	"github.com/idemgate/idemgate/web/internal/servertest"
	"github.com/idemgate/idemgate/web/proxy"
	"github.com/stretchr/testify/require"
)

// TestProxyConformance runs the Idempotency-Key draft's conformance suite (e2e/conformance)
// against idemgate proxy in front of the Node.js upstream: every MUST and SHOULD passes; the
// answers to the open questions are logged (docs/reference.md §12 lists them).
func TestProxyConformance(t *testing.T) {
	srv := servertest.Start(t, dbs.Postgres)
	upstream := startUpstream(t)
	p := startProxy(t, srv, proxy.Config{Upstream: upstream, RequireKey: []string{"/orders"},
		DocumentationURL: "https://example.com/docs/idempotency", UpstreamTimeout: 10 * time.Second})
	requireConformance(t, p)
}

func requireConformance(t *testing.T, base string) {
	t.Helper()
	cases, err := conformance.Cases()
	require.NoError(t, err)
	results := conformance.Run(context.Background(), base, servertest.OwnTransport(t), cases)
	t.Logf("conformance report:\n%s", conformance.Report(results))
	for _, r := range results {
		if r.Case.Level != conformance.LevelOpen {
			require.True(t, r.Pass, "%s %s: %v", r.Case.Level, r.Case.ID, r.Problems)
		}
	}
}
