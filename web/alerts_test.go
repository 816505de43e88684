package web

import (
	"encoding/json"
	"os"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// TestAlertRulesNameRealMetrics: docs/alerts.yml is valid YAML in Prometheus' rule-file shape,
// and every idemgate_ series its expressions use is one /metrics serves (a renamed metric
// must not leave a silent alert behind).
// histogramSuffix is what a histogram's series add to its name.
var histogramSuffix = regexp.MustCompile(`_(bucket|count|sum)$`)

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
	dashTenant(t, s)    // a tenant, so the per-tenant gauges have a series
	scrapeMetrics(t, s) // a first request, so the request histogram has a series
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
				if !ok { // a histogram's _count, _bucket or _sum is under the histogram's name
					_, ok = sc[histogramSuffix.ReplaceAllString(m, "")]
				}
				require.True(t, ok, "alert %s uses %s, which /metrics does not serve", r.Alert, m)
			}
		}
	}
	for _, want := range []string{"IdemgateReconciliationOverdue", "IdemgateReaperStale", "IdemgateWebhookDeliveriesFailed",
		"IdemgateStoreUnavailable", "IdemgateListenDown"} {
		require.Contains(t, alerts, want)
	}
}

// requireDashboardSeries: docs/grafana-idemgate.json is valid JSON, and every idemgate_ series
// its panels query is in sc (a histogram's _bucket and _count under the histogram's name), as
// TestAlertRulesNameRealMetrics checks the alert rules: a renamed metric must not leave an
// empty panel behind. Called with the scrape of TestMetricsCountEveryDecision, after which
// every labelled series has a value.
func requireDashboardSeries(t *testing.T, sc scrape) {
	t.Helper()
	raw, err := os.ReadFile("../docs/grafana-idemgate.json")
	require.NoError(t, err)
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	require.NoError(t, json.Unmarshal(raw, &dash))
	name := regexp.MustCompile(`idemgate_[a-z_]+`)
	queried := map[string]bool{}
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, m := range name.FindAllString(tg.Expr, -1) {
				_, ok := sc[m]
				if !ok {
					_, ok = sc[histogramSuffix.ReplaceAllString(m, "")]
				}
				require.True(t, ok, "panel %q uses %s, which /metrics does not serve", p.Title, m)
				queried[m] = true
			}
		}
	}
	require.True(t, queried["idemgate_group_admission_busy_seconds_total"], "the slot occupancy panel")
	require.True(t, queried["idemgate_acquires_total"])
}
