package web

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/models/modeltest"
	"github.com/idemgate/idemgate/services"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
)

// scrape is one parsed answer of GET /metrics.
type scrape map[string]*dto.MetricFamily

// scrapeMetrics fetches and parses s's /metrics.
func scrapeMetrics(t *testing.T, s *Server) scrape {
	t.Helper()
	resp, err := s.app.Test(httptest.NewRequest(http.MethodGet, "/metrics", nil), -1)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	return fams
}

// series returns every series of the family name, keyed by its labels ("k=v,k=v", sorted by
// name); the value is the counter's or gauge's value, or a histogram's sample count.
func (sc scrape) series(name string) map[string]float64 {
	out := map[string]float64{}
	f, ok := sc[name]
	if !ok {
		return out
	}
	for _, m := range f.GetMetric() {
		var ls []string
		for _, l := range m.GetLabel() {
			ls = append(ls, l.GetName()+"="+l.GetValue())
		}
		sort.Strings(ls)
		var v float64
		switch {
		case m.Counter != nil:
			v = m.GetCounter().GetValue()
		case m.Gauge != nil:
			v = m.GetGauge().GetValue()
		case m.Histogram != nil:
			v = float64(m.GetHistogram().GetSampleCount())
		case m.Untyped != nil:
			v = m.GetUntyped().GetValue()
		}
		out[strings.Join(ls, ",")] = v
	}
	return out
}

// value returns the single unlabelled series of name.
func (sc scrape) value(t *testing.T, name string) float64 {
	t.Helper()
	s := sc.series(name)
	v, ok := s[""]
	require.True(t, ok, "no series %s in the scrape (have %v)", name, s)
	return v
}

// namedTenantClient creates tenant name with an API key on s.
func namedTenantClient(t *testing.T, s *Server, name string) *apiClient {
	t.Helper()
	secret, err := s.accounts.CreateAPIKey(context.Background(), services.Installation(), name, "metrics test", "")
	require.NoError(t, err)
	return &apiClient{t: t, s: s, key: secret}
}

// TestMetricsCountEveryDecision (issue 5 point 4): real acquires, releases and outcomes through
// the API and the dashboard, in two tenants, a reaper pass that expires a hold and one that
// purges evidence; then one scrape, whose series must hold exactly what happened.
func TestMetricsCountEveryDecision(t *testing.T) {
	modeltest.Each(t, modeltest.Fresh(t), func(t *testing.T, db *models.DB) {
		ctx := context.Background()
		s := newTestServer(t, db)
		tenantA, tenantB := "metrics-a-"+dashRandom(), "metrics-b-"+dashRandom()
		a, b := namedTenantClient(t, s, tenantA), namedTenantClient(t, s, tenantB)
		ok := func(res apiResult, status int) apiResult {
			t.Helper()
			require.Equal(t, status, res.status, res.raw)
			return res
		}
		owner := func(res apiResult) string { return res.body["owner_token"].(string) }
		opID := func(res apiResult) string { return res.body["operation_id"].(string) }

		// Acquires: A 8 admitted, 2 duplicates, 1 conflict; B 1 admitted, 1 duplicate.
		fp := map[string]any{"fingerprint": "f1"}
		ok(acquire(a, "dup", fp), 201)
		ok(acquire(a, "dup", fp), 200)
		ok(acquire(a, "dup", fp), 200)
		ok(acquire(a, "dup", map[string]any{"fingerprint": "f2"}), 422)
		ok(acquire(b, "dup", fp), 201)
		ok(acquire(b, "dup", fp), 200)

		// API releases: one of each result; a request without owner_token is no decision.
		rel := ok(acquire(a, "rel", nil), 201)
		ok(a.do("POST", "/v1/release", map[string]any{"key": "rel", "owner_token": owner(rel)}), 200)
		wrong := ok(acquire(a, "wrong", nil), 201)
		ok(a.do("POST", "/v1/release", map[string]any{"key": "wrong", "owner_token": "ot_not-the-owner"}), 409)
		ok(a.do("POST", "/v1/release", map[string]any{"key": "never-acquired", "owner_token": owner(wrong)}), 404)
		ok(a.do("POST", "/v1/release", map[string]any{"key": "wrong"}), 400)

		// API outcomes: recorded, unchanged, invalid_transition, not_owner; then the
		// refused releases of a succeeded and an uncertain operation.
		done := ok(acquire(a, "done", nil), 201)
		outcome := func(res apiResult, token, status string) apiResult {
			return a.do("POST", "/v1/operations/"+opID(res)+"/outcome", map[string]any{"owner_token": token, "status": status})
		}
		ok(outcome(done, owner(done), "succeeded"), 200)
		ok(outcome(done, owner(done), "succeeded"), 200)
		ok(outcome(done, owner(done), "failed"), 409)
		ok(outcome(wrong, "ot_not-the-owner", "failed"), 403)
		ok(a.do("POST", "/v1/release", map[string]any{"key": "done", "owner_token": owner(done)}), 409)
		unsure := ok(acquire(a, "unsure", nil), 201)
		ok(outcome(unsure, owner(unsure), "uncertain"), 200)
		ok(a.do("POST", "/v1/release", map[string]any{"key": "unsure", "owner_token": owner(unsure)}), 409)

		// The dashboard: an operator releases one operation, records another's outcome,
		// then is refused the release of that succeeded one.
		opRel := ok(acquire(a, "op-release", nil), 201)
		opRec := ok(acquire(a, "op-reconcile", nil), 201)
		ok(acquire(a, "expire", map[string]any{"ttl_seconds": 1}), 201)
		browser := newDashBrowser(t, s)
		browser.mustLogin(dashOperator(t, db, services.RoleOperator, nil))
		act := func(res apiResult, action string, form url.Values) {
			t.Helper()
			page := browser.get("/operations/" + opID(res))
			require.Equal(t, http.StatusOK, page.status)
			form.Set("_csrf", page.csrf(t))
			got := browser.post("/operations/"+opID(res)+"/"+action, form)
			t.Logf("%s %s: %d", action, opID(res), got.status)
		}
		release := url.Values{"fencing_token": {"1"}, "reason": {"metrics test"}, "confirm": {"yes"}}
		release.Set("operation_id", opID(opRel))
		act(opRel, "release", release)
		act(opRec, "outcome", url.Values{"status": {"succeeded"}, "receipt": {"r-1"}, "note": {"checked"}})
		release.Set("operation_id", opID(opRec))
		act(opRec, "release", release)

		// The reaper: one pass expires the 1-second hold (its operation becomes
		// uncertain), one with a retention of 1 ns purges the two released operations.
		a.elapse(db, time.Second, "expire")
		log := s.log
		res, err := services.NewReaper(db, log, 0).WithObserver(s.Observer()).RunOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, services.ReapResult{HoldsExpired: 1, MarkedUncertain: 1}, res)
		purged := []string{opID(rel), opID(opRel)}
		var attempts, events int64
		require.NoError(t, db.Model(&models.Attempt{}).Where("operation_id IN ?", purged).Count(&attempts).Error)
		require.NoError(t, db.Model(&models.Event{}).Where("operation_id IN ?", purged).Count(&events).Error)
		require.EqualValues(t, 2, attempts, "one attempt each")
		require.EqualValues(t, 2, events, "one released event each")
		res, err = services.NewReaper(db, log, time.Nanosecond).WithObserver(s.Observer()).RunOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, services.ReapResult{OperationsPurged: 2, AttemptsPurged: 2, EventsPurged: 2}, res)

		// Requests that match no route must not create a series per path.
		anon := &apiClient{t: t, s: s}
		ok(anon.do("GET", "/no-such-page-"+dashRandom(), nil), 404)
		ok(anon.do("POST", "/healthz", nil), 405)
		// Authenticated, but no /v1 route: unmatched too, not the /v1 group's pattern.
		ok(a.do("GET", "/v1/no-such-page-"+dashRandom(), nil), 404)
		// Refused by the HTTP server before any middleware ran: still counted.
		status, _, _ := postOversized(t, s, "/v1/acquire", services.MaxBodyBytes+1)
		require.Equal(t, 413, status)

		sc := scrapeMetrics(t, s)
		require.Equal(t, map[string]float64{
			"result=admitted,tenant=" + tenantA:  8,
			"result=duplicate,tenant=" + tenantA: 2,
			"result=conflict,tenant=" + tenantA:  1,
			"result=admitted,tenant=" + tenantB:  1,
			"result=duplicate,tenant=" + tenantB: 1,
		}, sc.series("idemgate_acquires_total"))
		require.Equal(t, map[string]float64{
			"result=released,source=api":              1,
			"result=not_owner,source=api":             1,
			"result=key_not_held,source=api":          1,
			"result=effect_confirmed,source=api":      1,
			"result=outcome_uncertain,source=api":     1,
			"result=released,source=operator":         1,
			"result=effect_confirmed,source=operator": 1,
		}, sc.series("idemgate_releases_total"))
		require.Equal(t, map[string]float64{
			"result=recorded,source=api,status=succeeded":        1,
			"result=unchanged,source=api,status=succeeded":       1,
			"result=invalid_transition,source=api,status=failed": 1,
			"result=not_owner,source=api,status=failed":          1,
			"result=recorded,source=api,status=uncertain":        1,
			"result=recorded,source=operator,status=succeeded":   1,
		}, sc.series("idemgate_outcomes_total"))
		require.Equal(t, map[string]float64{"result=ok": 2, "result=error": 0}, sc.series("idemgate_reaper_runs_total"))
		require.Equal(t, map[string]float64{
			"action=holds_expired": 1, "action=marked_uncertain": 1, "action=operations_purged": 2,
			"action=attempts_purged": 2, "action=events_purged": 2, "action=sessions_purged": 0,
			"action=tombstones_written": 0,
		}, sc.series("idemgate_reaper_rows_total"))
		last := sc.value(t, "idemgate_reaper_last_success_timestamp_seconds")
		require.InDelta(t, float64(time.Now().Unix()), last, 10)
		// "unsure" (reported uncertain) and "expire" (marked by the reaper); B has none.
		require.Equal(t, map[string]float64{"tenant=" + tenantA: 2, "tenant=" + tenantB: 0},
			sc.series("idemgate_operations_needing_reconciliation"))
		require.Zero(t, sc.value(t, "idemgate_reconciliation_query_errors_total"))

		requests := sc.series("idemgate_http_request_duration_seconds")
		require.EqualValues(t, 9, requests["method=POST,route=/v1/acquire,status=201"])
		require.EqualValues(t, 3, requests["method=POST,route=/v1/acquire,status=200"])
		require.EqualValues(t, 1, requests["method=POST,route=/v1/acquire,status=422"])
		require.EqualValues(t, 3, requests["method=POST,route=/v1/release,status=409"])
		require.EqualValues(t, 1, requests["method=POST,route=/v1/operations/:id/outcome,status=403"])
		require.EqualValues(t, 2, requests["method=GET,route=unmatched,status=404"], "%v", requests)
		require.EqualValues(t, 1, requests["method=POST,route=unmatched,status=413"], "%v", requests)
		require.EqualValues(t, 1, requests["method=POST,route=unmatched,status=405"])
		require.EqualValues(t, 2, requests["method=POST,route=/operations/:id/release,status=303"]+
			requests["method=POST,route=/operations/:id/release,status=409"], "%v", requests)
		for labels := range requests {
			require.NotContains(t, labels, "no-such-page", "a raw path became a label")
			require.NotContains(t, labels, opID(done), "a raw path became a label")
		}
		if db.Dialect == models.Postgres { // the pool series are PostgreSQL's
			requireDashboardSeries(t, sc)
		}
	})
}

// TestPoolMetrics: the pool every query borrows from is exported as idemgate_db_pool_* with
// sane values on both databases (pgx's pool on PostgreSQL, database/sql's on SQLite), and
// database/sql's own go_sql_* series are not: on PostgreSQL they describe a wrapper, and one
// family lets the dashboards read either database.
func TestPoolMetrics(t *testing.T) {
	dbs.Each(t, func(t *testing.T, db *models.DB) {
		s := newTestServer(t, db)
		c := newTenantClient(t, s)
		require.Equal(t, http.StatusCreated, acquire(c, "pool-"+dashRandom(), nil).status)
		sc := scrapeMetrics(t, s)
		require.NotContains(t, sc, "go_sql_max_open_connections")
		if db.Dialect == models.SQLite {
			require.EqualValues(t, 8, sc.value(t, "idemgate_db_pool_max_connections"))
			total := sc.value(t, "idemgate_db_pool_total_connections")
			require.GreaterOrEqual(t, total, 1.0)
			require.Equal(t, total, sc.value(t, "idemgate_db_pool_acquired_connections")+
				sc.value(t, "idemgate_db_pool_idle_connections"))
			require.Zero(t, sc.value(t, "idemgate_db_pool_constructing_connections"))
			return
		}
		require.NotContains(t, sc, "go_sql_max_open_connections", "database/sql's wrapper pool is not the real one")
		maxConns := sc.value(t, "idemgate_db_pool_max_connections")
		total := sc.value(t, "idemgate_db_pool_total_connections")
		require.EqualValues(t, 16, maxConns)
		require.GreaterOrEqual(t, total, 1.0)
		require.LessOrEqual(t, total, maxConns)
		require.Equal(t, total, sc.value(t, "idemgate_db_pool_acquired_connections")+
			sc.value(t, "idemgate_db_pool_idle_connections")+sc.value(t, "idemgate_db_pool_constructing_connections"))
		require.Greater(t, sc.value(t, "idemgate_db_pool_acquires_total"), 0.0)
		require.GreaterOrEqual(t, sc.value(t, "idemgate_db_pool_new_connections_total"), total)
		require.Greater(t, sc.value(t, "idemgate_db_pool_acquire_duration_seconds_total"), 0.0)
		for _, name := range []string{"idemgate_db_pool_empty_acquires_total", "idemgate_db_pool_empty_acquire_wait_seconds_total",
			"idemgate_db_pool_canceled_acquires_total", "idemgate_db_pool_max_lifetime_destroyed_connections_total",
			"idemgate_db_pool_max_idle_destroyed_connections_total"} {
			require.GreaterOrEqual(t, sc.value(t, name), 0.0, name)
		}
	})
}

// TestGroupAdmissionMetrics: with group admission on (the served default), each of 48
// concurrent acquires is counted exactly once, alone or in a batch (whether any batch forms
// depends on timing), on both databases, no statement was contended, and the statement slot's
// busy seconds are more than zero and no more than the time the acquires took.
func TestGroupAdmissionMetrics(t *testing.T) {
	dbs.Each(t, func(t *testing.T, db *models.DB) {
		s := newTestServer(t, db)
		c := newTenantClient(t, s)
		const n = 48
		begin := time.Now()
		var wg sync.WaitGroup
		statuses := make([]int, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				statuses[i] = acquire(c, fmt.Sprintf("grp-%d-%s", i, dashRandom()), nil).status
			}()
		}
		wg.Wait()
		span := time.Since(begin)
		for i, st := range statuses {
			require.Equal(t, http.StatusCreated, st, "acquire %d", i)
		}
		sc := scrapeMetrics(t, s)
		busy := sc.value(t, "idemgate_group_admission_busy_seconds_total")
		require.Positive(t, busy, "48 acquires ran statements from the slot")
		require.LessOrEqual(t, busy, span.Seconds(), "one slot: its statements never overlap")
		batched, batches := sc.value(t, "idemgate_group_admission_batched_acquires_total"), sc.value(t, "idemgate_group_admission_batches_total")
		singles := sc.value(t, "idemgate_group_admission_single_acquires_total")
		require.Zero(t, sc.value(t, "idemgate_group_admission_contended_total"), "no row lock was held")
		require.EqualValues(t, n, batched+singles, "every acquire decided once, alone or in a batch")
		require.LessOrEqual(t, 2*batches, batched, "a batch holds at least two acquires")
		linger := sc.value(t, "idemgate_group_admission_linger_seconds_total")
		require.GreaterOrEqual(t, linger, 0.0)
		require.LessOrEqual(t, busy+linger, span.Seconds(), "one slot: it runs a statement or lingers, never both")
		lingers := sc.series("idemgate_group_admission_lingers_total")
		gathered, ok := lingers["result=gathered"]
		require.True(t, ok, "lingers_total{result=gathered} in %v", lingers)
		expired, ok := lingers["result=expired"]
		require.True(t, ok, "lingers_total{result=expired} in %v", lingers)
		require.LessOrEqual(t, gathered+expired, batches, "at most one linger after each statement of several")
		if gathered+expired == 0 {
			require.Zero(t, linger)
		}
	})
}

// TestReconciliationCollectorBoundsDatabaseWork: however often /metrics is scraped, the count
// of operations needing reconciliation is asked of the database at most once per interval, a
// slow database cannot hold a scrape longer than the timeout, and a failure drops the gauge
// (no stale numbers) and counts an error without failing the scrape.
func TestReconciliationCollectorBoundsDatabaseWork(t *testing.T) {
	var (
		mu    sync.Mutex
		calls int
		fail  error
		block bool
	)
	query := func(ctx context.Context) ([]services.TenantCount, error) {
		mu.Lock()
		calls++
		f, b := fail, block
		mu.Unlock()
		if b {
			<-ctx.Done()
			return nil, ctx.Err()
		}
		return []services.TenantCount{{Tenant: "shop", Count: 3, OldestUncertainAge: time.Hour}}, f
	}
	now := time.Unix(1_000_000, 0)
	rc := newReconciliationCollector(query, newTestServer(t, dbs.SQLite).log)
	rc.now = func() time.Time { return now }
	rc.timeout = 50 * time.Millisecond
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(rc)
	gather := func() map[string]float64 {
		fams, err := reg.Gather()
		require.NoError(t, err)
		out := map[string]float64{}
		for _, f := range fams {
			for _, m := range f.GetMetric() {
				key := f.GetName()
				for _, l := range m.GetLabel() {
					key += "," + l.GetName() + "=" + l.GetValue()
				}
				if m.Gauge != nil {
					out[key] = m.GetGauge().GetValue()
				} else {
					out[key] = m.GetCounter().GetValue()
				}
			}
		}
		return out
	}
	const oldest = "idemgate_reconciliation_oldest_uncertain_age_seconds,tenant=shop"
	ok := func(age float64) map[string]float64 {
		return map[string]float64{"idemgate_operations_needing_reconciliation,tenant=shop": 3, oldest: age,
			"idemgate_reconciliation_query_errors_total": 0}
	}

	require.Equal(t, ok(3600), gather())
	for i := 1; i <= 5; i++ {
		now = now.Add(time.Second)
		want := ok(3600 + float64(i))
		if i == 5 {
			want = ok(3600) // asked again: the query's own age
		}
		require.Equal(t, want, gather(), "the cached age grows with the time since the query")
	}
	require.Equal(t, 2, calls, "one query at start, one after 5 s")

	mu.Lock()
	fail = errors.New("database down")
	mu.Unlock()
	now = now.Add(reconciliationMaxAge)
	down := map[string]float64{"idemgate_reconciliation_query_errors_total": 1}
	require.Equal(t, down, gather())
	require.Equal(t, down, gather(), "a failure is cached too")
	require.Equal(t, 3, calls)

	mu.Lock()
	fail, block = nil, true
	mu.Unlock()
	now = now.Add(reconciliationMaxAge)
	start := time.Now()
	require.Equal(t, map[string]float64{"idemgate_reconciliation_query_errors_total": 2}, gather())
	require.Less(t, time.Since(start), time.Second, "the query is cut off at its timeout")

	mu.Lock()
	block = false
	mu.Unlock()
	now = now.Add(reconciliationMaxAge)
	require.Equal(t, map[string]float64{"idemgate_operations_needing_reconciliation,tenant=shop": 3, oldest: 3600,
		"idemgate_reconciliation_query_errors_total": 2}, gather(), "recovers by itself")
}

// TestMetricsToken: with IDEMGATE_METRICS_TOKEN set, /metrics answers only that bearer token;
// an API key, a wrong token or none is 401 unauthorized (problem+json, WWW-Authenticate).
func TestMetricsToken(t *testing.T) {
	cfg := testConfig(t, dbs.SQLite, slog.New(slog.DiscardHandler))
	const token = "metrics_token_0123456789abcdef"
	cfg.MetricsToken = token
	s := New(cfg)
	tenant := newTenantClient(t, s)
	for _, c := range []*apiClient{{t: t, s: s}, {t: t, s: s, key: token + "x"}, {t: t, s: s, key: token[1:]}, tenant} {
		res := problemOf(t, c.do("GET", "/metrics", nil), 401, "unauthorized")
		require.Equal(t, `Bearer realm="idemgate-metrics"`, res.header.Get("WWW-Authenticate"))
		require.NotContains(t, res.raw, "idemgate_")
	}
	ok := (&apiClient{t: t, s: s, key: token}).do("GET", "/metrics", nil)
	require.Equal(t, 200, ok.status)
	require.Contains(t, ok.raw, "idemgate_http_request_duration_seconds")
	// The API is unaffected.
	require.Equal(t, 201, acquire(tenant, "metrics-token-"+dashRandom(), nil).status)
}
