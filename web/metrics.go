package web

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/idemgate/idemgate/services"
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the Prometheus series this package records (exposed at GET /metrics). The
// services' decisions are counted in them by the server's observer (observer.go), the
// services.Observer of its Admission and Reconciliation and of the reaper (Server.Observer), so
// every decision is counted where it is taken, whichever route or process loop asked for it.
//
// Label cardinality is bounded by construction: results and statuses are the fixed codes of
// services, routes are the registered patterns (routeLabel), and tenant is the name of a
// tenant, of which there are few: tenants are created by operators (`apikey create`, the admin
// page), never by API callers. Keys and operation ids never become labels.
type metrics struct {
	acquires          *prometheus.CounterVec
	releases          *prometheus.CounterVec
	outcomes          *prometheus.CounterVec
	reaperRuns        *prometheus.CounterVec
	reaperRows        *prometheus.CounterVec
	reaperLastSuccess prometheus.Gauge
	requests          *prometheus.HistogramVec
}

// Reaper actions, the action label of idemgate_reaper_rows_total: one per ReapResult field.
var reaperActions = []string{"holds_expired", "marked_uncertain", "operations_purged", "attempts_purged",
	"events_purged", "sessions_purged", "tombstones_written"}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		acquires: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemgate_acquires_total",
			Help: "Acquire calls logged as attempts, by tenant name and result (admitted, duplicate, conflict).",
		}, []string{"tenant", "result"}),
		releases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemgate_releases_total",
			Help: "Owner-checked releases, by source (api, operator) and result (released, or the refusal: " +
				"not_owner, effect_confirmed, outcome_uncertain, key_not_held, invalid_transition, not_found).",
		}, []string{"source", "result"}),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemgate_outcomes_total",
			Help: "Outcomes recorded or refused, by source (api, operator), status asked for (succeeded, failed, " +
				"uncertain) and result (recorded, unchanged, or the refusal: not_owner, invalid_transition, not_found).",
		}, []string{"source", "status", "result"}),
		reaperRuns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemgate_reaper_runs_total",
			Help: "Reaper passes of this process, by result (ok, error).",
		}, []string{"result"}),
		reaperRows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemgate_reaper_rows_total",
			Help: "Rows the reaper changed, by action (holds_expired, marked_uncertain, operations_purged, " +
				"attempts_purged, events_purged, sessions_purged, tombstones_written).",
		}, []string{"action"}),
		reaperLastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemgate_reaper_last_success_timestamp_seconds",
			Help: "Unix time of this process's last reaper pass that completed without error (0: none yet).",
		}),
		requests: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idemgate_http_request_duration_seconds",
			Help:    "HTTP request latency in seconds, by route pattern, method and status.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"route", "method", "status"}),
	}
	// Series that exist from the start, so rate() and alerts see 0 rather than nothing.
	for _, r := range []string{"ok", "error"} {
		m.reaperRuns.WithLabelValues(r)
	}
	for _, a := range reaperActions {
		m.reaperRows.WithLabelValues(a)
	}
	reg.MustRegister(m.acquires, m.releases, m.outcomes, m.reaperRuns, m.reaperRows, m.reaperLastSuccess, m.requests)
	registerBuildInfo(reg)
	return m
}

// routeUnmatched is the route label of requests that matched no route of their own (404, 405),
// so that scanning random paths cannot create series.
const routeUnmatched = "unmatched"

// routeLabel is the route pattern of a request answered with status (never the raw path: keys
// would explode the label set). A request that only middleware matched is labelled with that
// middleware's registered prefix (/v1 for an API call refused by authentication, /static/ for
// assets), or routeUnmatched when that is the application-wide middleware, whose pattern "/"
// would otherwise be confused with the overview page's.
func routeLabel(c *fiber.Ctx, status int) string {
	r := c.Route()
	switch {
	case len(r.Handlers) == 0:
		// Fiber's stand-in for a request refused before routing: its Path is the raw path.
		return routeUnmatched
	case status == fiber.StatusMethodNotAllowed:
		return routeUnmatched // no route for this method, by definition
	case r.Path == "/" && c.Path() != "/":
		// Only "GET /" has this pattern; anything else here is the global middleware.
		return routeUnmatched
	case r.Path == "/v1" && status == fiber.StatusNotFound:
		// Authenticated, then no /v1 route matched: the group's middleware is all that ran.
		return routeUnmatched
	}
	// A literal colon is escaped in the pattern (/v1/acquire\:batch); the label shows the path.
	return strings.ReplaceAll(r.Path, `\:`, ":")
}

// methodLabel maps the request method to a constant string: Fiber's method string points into
// a buffer that is reused after the request, and a label value outlives it.
func methodLabel(m string) string {
	switch m {
	case fiber.MethodGet:
		return fiber.MethodGet
	case fiber.MethodHead:
		return fiber.MethodHead
	case fiber.MethodPost:
		return fiber.MethodPost
	case fiber.MethodPut:
		return fiber.MethodPut
	case fiber.MethodPatch:
		return fiber.MethodPatch
	case fiber.MethodDelete:
		return fiber.MethodDelete
	case fiber.MethodOptions:
		return fiber.MethodOptions
	}
	return "OTHER"
}

// metricsGuard lets GET /metrics through when token is empty (docs/reference.md §4: no auth), else only
// with "Authorization: Bearer <token>"; anything else is 401 unauthorized. The comparison is
// of SHA-256 digests in constant time, so timing tells nothing about the token.
func metricsGuard(token string) fiber.Handler {
	if token == "" {
		return func(c *fiber.Ctx) error { return c.Next() }
	}
	want := sha256.Sum256([]byte(token))
	return func(c *fiber.Ctx) error {
		got, ok := strings.CutPrefix(c.Get(fiber.HeaderAuthorization), "Bearer ")
		sum := sha256.Sum256([]byte(got))
		if !ok || subtle.ConstantTimeCompare(sum[:], want[:]) != 1 {
			c.Set(fiber.HeaderWWWAuthenticate, `Bearer realm="idemgate-metrics"`)
			return services.ErrUnauthorized
		}
		return c.Next()
	}
}

// poolCollector exports the connection pool every query borrows from (services.PoolStats:
// pgxpool's on PostgreSQL, database/sql's on SQLite), one family for both databases so the
// dashboards read the same series. It is written here rather than taken from
// github.com/IBM/pgxpoolprometheus because that one's names break Prometheus conventions
// (counters without _total, durations in nanoseconds) and it reads pgx alone. PoolStats only
// reads the pool's counters under its lock: a scrape costs microseconds and never touches the
// database.
type poolCollector struct {
	stats func() services.PoolStats

	acquired, idle, constructing, total, max                     *prometheus.Desc
	acquires, acquireSeconds, emptyAcquires, emptyWaitSeconds    *prometheus.Desc
	canceledAcquires, newConns, lifetimeDestroyed, idleDestroyed *prometheus.Desc
}

func newPoolCollector(stats func() services.PoolStats) *poolCollector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("idemgate_db_pool_"+name, help, nil, nil)
	}
	return &poolCollector{
		stats:             stats,
		acquired:          d("acquired_connections", "Connections of the database pool in use now."),
		idle:              d("idle_connections", "Idle connections of the database pool now."),
		constructing:      d("constructing_connections", "Connections of the database pool being opened now (always 0 on SQLite)."),
		total:             d("total_connections", "Connections of the database pool now: acquired + idle + constructing."),
		max:               d("max_connections", "Largest size of the database pool (IDEMGATE_DB_MAX_CONNS; 0 is unlimited)."),
		acquires:          d("acquires_total", "Connections acquired from the database pool (PostgreSQL only; 0 on SQLite)."),
		acquireSeconds:    d("acquire_duration_seconds_total", "Time spent acquiring connections from the database pool, in seconds (PostgreSQL only)."),
		emptyAcquires:     d("empty_acquires_total", "Acquires that had to wait for a connection because the database pool was empty."),
		emptyWaitSeconds:  d("empty_acquire_wait_seconds_total", "Time acquires waited because the database pool was empty, in seconds."),
		canceledAcquires:  d("canceled_acquires_total", "Acquires from the database pool given up because their context ended (PostgreSQL only)."),
		newConns:          d("new_connections_total", "Connections the database pool opened (PostgreSQL only)."),
		lifetimeDestroyed: d("max_lifetime_destroyed_connections_total", "Connections closed for exceeding their maximum lifetime."),
		idleDestroyed:     d("max_idle_destroyed_connections_total", "Connections closed for being idle too long (5 minutes)."),
	}
}

// Describe sends the descriptions of every series (prometheus.Collector).
func (p *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{p.acquired, p.idle, p.constructing, p.total, p.max, p.acquires,
		p.acquireSeconds, p.emptyAcquires, p.emptyWaitSeconds, p.canceledAcquires, p.newConns,
		p.lifetimeDestroyed, p.idleDestroyed} {
		ch <- d
	}
}

// Collect reads the pool's statistics once and sends them (prometheus.Collector).
func (p *poolCollector) Collect(ch chan<- prometheus.Metric) {
	s := p.stats()
	g := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	c := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
	}
	g(p.acquired, float64(s.Acquired))
	g(p.idle, float64(s.Idle))
	g(p.constructing, float64(s.Constructing))
	g(p.total, float64(s.Total))
	g(p.max, float64(s.Max))
	c(p.acquires, float64(s.Acquires))
	c(p.acquireSeconds, s.AcquireDuration.Seconds())
	c(p.emptyAcquires, float64(s.EmptyAcquires))
	c(p.emptyWaitSeconds, s.EmptyWait.Seconds())
	c(p.canceledAcquires, float64(s.CanceledAcquires))
	c(p.newConns, float64(s.NewConns))
	c(p.lifetimeDestroyed, float64(s.LifetimeDestroyed))
	c(p.idleDestroyed, float64(s.IdleDestroyed))
}

// Bounds of the reconciliation collector's database query.
const (
	// reconciliationMaxAge is the longest a count is reused: however often Prometheus (or
	// several) scrape, the database is asked at most once per this interval per process.
	reconciliationMaxAge = 5 * time.Second
	// reconciliationTimeout bounds the query, so a slow database cannot hang a scrape.
	reconciliationTimeout = 2 * time.Second
)

// reconciliationCollector exports idemgate_operations_needing_reconciliation and
// idemgate_reconciliation_oldest_uncertain_age_seconds per tenant, counted by the database at scrape time (services.Dashboard.NeedsReconciliationByTenant) and
// cached for reconciliationMaxAge. When the last query failed the gauge is left out of the
// scrape (rather than showing stale numbers) and the failure is counted in
// idemgate_reconciliation_query_errors_total; the rest of the scrape is unaffected.
type reconciliationCollector struct {
	query   func(context.Context) ([]services.TenantCount, error)
	log     *slog.Logger
	now     func() time.Time
	maxAge  time.Duration
	timeout time.Duration

	gauge, oldest, errorsDesc *prometheus.Desc

	mu      sync.Mutex // held across a query, so concurrent scrapes share it
	fetched time.Time
	counts  []services.TenantCount
	ok      bool
	errors  int64
}

func newReconciliationCollector(query func(context.Context) ([]services.TenantCount, error), log *slog.Logger) *reconciliationCollector {
	return &reconciliationCollector{
		query: query, log: log, now: time.Now, maxAge: reconciliationMaxAge, timeout: reconciliationTimeout,
		gauge: prometheus.NewDesc("idemgate_operations_needing_reconciliation",
			"Operations in state uncertain (needing reconciliation, docs/reference.md §3), by tenant name; counted by the "+
				"database at most every 5 s.", []string{"tenant"}, nil),
		oldest: prometheus.NewDesc("idemgate_reconciliation_oldest_uncertain_age_seconds",
			"How long the tenant's oldest uncertain operation has been uncertain, in seconds (0 when none is): "+
				"alert on it to reconcile within N hours. Read with idemgate_operations_needing_reconciliation.",
			[]string{"tenant"}, nil),
		errorsDesc: prometheus.NewDesc("idemgate_reconciliation_query_errors_total",
			"Scrape-time counts of idemgate_operations_needing_reconciliation that failed (database unavailable "+
				"or slower than 2 s).", nil, nil),
	}
}

// Describe sends the descriptions of both series (prometheus.Collector).
func (r *reconciliationCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- r.gauge
	ch <- r.oldest
	ch <- r.errorsDesc
}

// Collect sends the counts, asking the database first if the cached ones are older than
// maxAge (prometheus.Collector).
func (r *reconciliationCollector) Collect(ch chan<- prometheus.Metric) {
	r.mu.Lock()
	if now := r.now(); r.fetched.IsZero() || now.Sub(r.fetched) >= r.maxAge {
		ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
		counts, err := r.query(ctx)
		cancel()
		// A failure is cached too: a database in trouble is not asked again on every scrape.
		r.fetched, r.counts, r.ok = now, counts, err == nil
		if err != nil {
			r.errors++
			r.log.Warn("counting operations needing reconciliation for metrics failed", "err", err)
		}
	}
	counts, ok, errs, fetched := r.counts, r.ok, r.errors, r.fetched
	r.mu.Unlock()
	if ok {
		for _, c := range counts {
			ch <- prometheus.MustNewConstMetric(r.gauge, prometheus.GaugeValue, float64(c.Count), c.Tenant)
			// The age grows between two queries: what is cached is the oldest operation's
			// uncertain time, in effect, so the gauge adds the time since the query.
			age := c.OldestUncertainAge
			if age > 0 {
				age += r.now().Sub(fetched)
			}
			ch <- prometheus.MustNewConstMetric(r.oldest, prometheus.GaugeValue, age.Seconds(), c.Tenant)
		}
	}
	ch <- prometheus.MustNewConstMetric(r.errorsDesc, prometheus.CounterValue, float64(errs))
}

// registerWaiters exports how many requests wait for an operation's outcome right now
// (GET /v1/operations/{id}?wait=, docs/reference.md §8): near IDEMGATE_MAX_WAITERS, waits are
// about to be refused with 503 too_many_waiters. It also exports whether the waiters' LISTEN
// connection is up (docs/operations.md "High availability": alert when it stays 0).
func registerWaiters(reg prometheus.Registerer, aw *services.Awaiter) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "idemgate_waiting_requests",
		Help: "Requests waiting for an operation to leave in_progress (GET /v1/operations/{id}?wait=) on this instance.",
	}, func() float64 { return float64(aw.Waiting()) }))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "idemgate_listen_connected",
		Help: "1 while this instance's LISTEN connection to PostgreSQL is up, else 0 (always 0 on SQLite and with IDEMGATE_LISTEN=false). " +
			"While 0, waits end by polling every 100 ms; after a failover it returns to 1 once the connection reaches the new primary.",
	}, func() float64 {
		if aw.Listening() {
			return 1
		}
		return 0
	}))
}

// lingersHelp is the help text of both series of idemgate_group_admission_lingers_total.
const lingersHelp = "Lingers of the group admission statement slot by how they ended: gathered (at least half the acquires it waited for came) or expired (it ended at its bound with fewer; under IDEMGATE_GROUP_LINGER=auto the slot then skips lingers for a while)."

// registerGroupStats exports group admission's counters (services.GroupStats): how many
// statements decided several acquires, how many acquires they carried, how many went alone,
// how many statements gave up on a row lock (their acquires then decided alone), the seconds
// the statement slot was busy and the seconds it lingered, and how its lingers ended.
// Constant zero when grouping is off.
func registerGroupStats(reg prometheus.Registerer, stats func() services.GroupStats) {
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "idemgate_group_admission_batches_total",
			Help: "Statements that decided more than one acquire (group admission).",
		}, func() float64 { return float64(stats().Batches) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "idemgate_group_admission_batched_acquires_total",
			Help: "Acquires decided in a statement with others (group admission).",
		}, func() float64 { return float64(stats().Items) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "idemgate_group_admission_single_acquires_total",
			Help: "Acquires decided in a statement of their own: the statement slot was free, or they were the only one waiting when it came free (group admission).",
		}, func() float64 { return float64(stats().Singles) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "idemgate_group_admission_contended_total",
			Help: "Group admission statements undone because an acquire in them would have waited on a row lock; their acquires were decided alone.",
		}, func() float64 { return float64(stats().Contended) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "idemgate_group_admission_busy_seconds_total",
			Help: "Seconds the group admission statement slot spent running statements (execution and commit). Its rate is the slot's occupancy: near 1, every acquire waits for the statement in flight, and the acquire rate grows only as batches grow.",
		}, func() float64 { return stats().Busy.Seconds() }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "idemgate_group_admission_linger_seconds_total",
			Help: "Seconds the group admission statement slot spent lingering: after a statement of several acquires, waiting with no statement running for the callers it answered to come back (IDEMGATE_GROUP_LINGER).",
		}, func() float64 { return stats().Linger.Seconds() }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "idemgate_group_admission_lingers_total",
			Help:        lingersHelp,
			ConstLabels: prometheus.Labels{"result": "gathered"},
		}, func() float64 { return float64(stats().LingersGathered) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "idemgate_group_admission_lingers_total",
			Help:        lingersHelp,
			ConstLabels: prometheus.Labels{"result": "expired"},
		}, func() float64 { return float64(stats().LingersExpired) }),
	)
}

// registerWebhookStats exports the dispatcher's attempts by result (services.WebhookStats) as
// idemgate_webhook_attempts_total{result="delivered|retried|failed"}; zeros when stats is nil
// (no dispatcher in this process). docs/alerts.yml alerts on failed.
func registerWebhookStats(reg prometheus.Registerer, stats func() services.WebhookStats) {
	if stats == nil {
		stats = func() services.WebhookStats { return services.WebhookStats{} }
	}
	for _, r := range []struct {
		result string
		get    func(services.WebhookStats) int64
	}{
		{"delivered", func(s services.WebhookStats) int64 { return s.Delivered }},
		{"retried", func(s services.WebhookStats) int64 { return s.Retried }},
		{"failed", func(s services.WebhookStats) int64 { return s.Failed }},
	} {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "idemgate_webhook_attempts_total",
			Help:        "Webhook delivery attempts of this process by result: delivered (2xx), retried (failed, retry scheduled), failed (last attempt failed, given up).",
			ConstLabels: prometheus.Labels{"result": r.result},
		}, func() float64 { return float64(r.get(stats())) }))
	}
}
