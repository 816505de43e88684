package web

import (
	"os"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// TestAlertRulesNameRealMetrics: docs/alerts.yml is valid YAML in Prometheus' rule-file shape,
// and every idemgate_ series its expressions use is one /metrics serves (a renamed metric
// must not leave a silent alert behind).
func TestAlertRulesNameRealMetrics(t *testing.T) {
	raw, err := os.ReadFile("../docs/alerts.yml")
	require.NoError(t, err)
	var file struct {
		Groups []struct {
			Name  string
			Rules []struct {
				Alert string
				Expr  string
			}
		}
	}
	require.NoError(t, yaml.Unmarshal(raw, &file))
	require.NotEmpty(t, file.Groups)
	s := newTestServer(t, dbs.SQLite)
	dashTenant(t, s) // a tenant, so the per-tenant gauges have a series
	sc := scrapeMetrics(t, s)
	name := regexp.MustCompile(`idemgate_[a-z_]+`)
	var alerts []string
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			require.NotEmpty(t, r.Alert)
			require.NotEmpty(t, r.Expr, r.Alert)
			alerts = append(alerts, r.Alert)
			for _, m := range name.FindAllString(r.Expr, -1) {
				_, ok := sc[m]
				require.True(t, ok, "alert %s uses %s, which /metrics does not serve", r.Alert, m)
			}
		}
	}
	for _, want := range []string{"IdemgateReconciliationOverdue", "IdemgateReaperStale", "IdemgateWebhookDeliveriesFailed"} {
		require.Contains(t, alerts, want)
	}
}
