package web

import (
	"context"
	"log/slog"
	"net"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/adaptor"
	"github.com/gofiber/fiber/v2/middleware/recover"
	"github.com/gofiber/fiber/v2/middleware/session"
	"github.com/idemgate/idemgate/services"
	"github.com/idemgate/idemgate/services/playback"
	"github.com/idemgate/idemgate/web/telemetry"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"
)

// Config is what the HTTP layer needs. Services, Log and DB are required; the zero value of
// every other field is a default or off.
type Config struct {
	// Services are the services the routes call (services.New). Those New needs are
	// Admission, Reads, Reconciliation, Dashboard, Audit, Auth, Accounts and Sessions; the
	// others may be nil:
	//   - Admission and Reconciliation: New uses copies that report their decisions to the
	//     server's Observer (metrics and spans); the Services are not changed.
	//   - Dashboard also counts the reconciliation gauge of /metrics.
	//   - Webhooks nil leaves the admin page's webhook section and the delivery log out.
	//   - Awaiter lets GET /v1/operations/{id}?wait= wait for an outcome without holding a
	//     database connection (docs/reference.md §8). Its Run must be running; Shutdown
	//     closes it, so waiting requests answer at once instead of holding up the shutdown.
	//     Nil (tools and tests that never wait): wait is validated and the operation read at
	//     once.
	//   - Dispatcher, when this process runs one, is exported as
	//     idemgate_webhook_attempts_total (constant zeros without).
	//   - Reaper is not used: the caller runs it, with Server.Observer.
	*services.Services
	// Log is where requests are logged: one access line each, and errors. Wrap its handler
	// with logging.NewHandler so every line logged during a request carries its request_id.
	Log *slog.Logger
	// MetricsToken, when not empty, is the bearer token GET /metrics requires: the metrics name
	// tenants and their volumes, and docs/reference.md §4 leaves the endpoint unauthenticated by default.
	MetricsToken string
	// SecureCookies marks session and CSRF cookies Secure; set it when served over TLS.
	SecureCookies bool
	// StoreTimeout is the deadline of each request's database work (0: DefaultStoreTimeout).
	// Past it the request is answered 503 store_unavailable with Retry-After, whatever the
	// database is doing: a stalled database (connection open, no bytes) must not hold callers
	// for the whole stall. The CSV export gets it per batch of rows.
	StoreTimeout time.Duration
	// WriteTimeout is how long a response may make no progress to the client before the
	// connection is closed (0: DefaultWriteTimeout). A streamed response (the CSV export)
	// has no bound on its total time as long as the client keeps reading.
	WriteTimeout time.Duration
	// MaxConcurrentExports is how many /audit.csv exports this instance runs at once (0: a
	// quarter of the database pool's connections, at least 1). Each export's page queries
	// take a pool connection for up to a second on a large range; more exports than this
	// made acquires wait for connections, so an export beyond the cap is answered 429 with
	// Retry-After at once instead of queueing on the pool.
	MaxConcurrentExports int
	// TracerProvider, when not nil, gets a server span for every request (tracing.go:
	// traceRequests) with the decision's attributes (the services report it to the server's
	// Observer, observer.go), and the access lines and latency exemplars carry its trace id.
	// nil is tracing off: no middleware is installed at all.
	TracerProvider trace.TracerProvider
	// TraceKeys lets raw idempotency keys onto spans (IDEMGATE_TRACE_KEYS); without it only
	// their digest is recorded (idemgate.key_hash).
	TraceKeys bool
}

// exportSlots is Config.MaxConcurrentExports or its default: a quarter of the pool's
// connections (services.Database.MaxConns; 8 when unlimited), at least 1.
func exportSlots(cfg Config) int {
	if cfg.MaxConcurrentExports > 0 {
		return cfg.MaxConcurrentExports
	}
	pool := cfg.Database.MaxConns()
	if pool <= 0 {
		pool = 8
	}
	return max(1, pool/4)
}

// DefaultWriteTimeout is Config.WriteTimeout's default.
const DefaultWriteTimeout = 30 * time.Second

// DefaultStoreTimeout is Config.StoreTimeout's default.
const DefaultStoreTimeout = 5 * time.Second

// The database-backed session store (Services.Sessions), so any instance serves any operator
// and restarts log nobody out (docs/reference.md §5): fiber's session middleware needs exactly
// this method set, which services provides without importing fiber.
var _ fiber.Storage = (*services.SessionStore)(nil)

// Server is the Fiber application with its dependencies.
type Server struct {
	app      *fiber.App
	log      *slog.Logger
	adm      *services.Admission
	reads    *services.Reads
	recon    *services.Reconciliation
	dash     *services.Dashboard
	audit    *services.Audit
	auth     *services.Auth
	accounts *services.Accounts
	db       *services.Database
	policies *services.Policies
	sessions *session.Store
	metrics  *metrics
	// obs reports the services' decisions to metrics and to request spans (observer.go).
	obs    *observer
	secure bool
	// storeTimeout bounds the database work of each request (Config.StoreTimeout).
	storeTimeout time.Duration
	// writeTimeout is the idle bound of each response's writes (Config.WriteTimeout).
	writeTimeout time.Duration
	// exports holds one token per running CSV export (Config.MaxConcurrentExports).
	exports chan struct{}
	// authFails counts failed API-key authentications per client address (security.go).
	authFails *authFailureLimiter
	// webhooks is Config.Webhooks (dashboard_webhooks.go); nil when not configured.
	webhooks *services.Webhooks
	// awaiter serves waiting operation reads (Config.Awaiter).
	awaiter *services.Awaiter
	// player plays the Explore page's playbacks in a sandbox store of its own
	// (dashboard_explore.go); Shutdown removes that store.
	player *playback.Player
}

// New builds the Fiber application with every route of routes.go.
func New(cfg Config) *Server {
	if cfg.Services == nil {
		panic("web.New: Config.Services is required")
	}
	for name, missing := range map[string]bool{"Admission": cfg.Admission == nil, "Reads": cfg.Reads == nil,
		"Reconciliation": cfg.Reconciliation == nil, "Dashboard": cfg.Dashboard == nil, "Audit": cfg.Audit == nil,
		"Auth": cfg.Auth == nil, "Accounts": cfg.Accounts == nil, "Database": cfg.Database == nil, "Policies": cfg.Policies == nil, "Log": cfg.Log == nil, "Sessions": cfg.Sessions == nil} {
		if missing {
			panic("web.New: Config." + name + " is required")
		}
	}
	s := &Server{log: cfg.Log, auth: cfg.Auth, accounts: cfg.Accounts, db: cfg.Database, policies: cfg.Policies, secure: cfg.SecureCookies,
		authFails: newAuthFailureLimiter(cfg.Log), storeTimeout: cfg.StoreTimeout, awaiter: cfg.Awaiter,
		player: playback.New(cfg.Log)}
	if s.storeTimeout <= 0 {
		s.storeTimeout = DefaultStoreTimeout
	}
	if s.writeTimeout = cfg.WriteTimeout; s.writeTimeout <= 0 {
		s.writeTimeout = DefaultWriteTimeout
	}
	s.exports = make(chan struct{}, exportSlots(cfg))
	s.app = fiber.New(fiber.Config{
		AppName:               "idemgate",
		DisableStartupMessage: true,
		BodyLimit:             services.MaxBodyBytes,
		ErrorHandler:          s.errorHandler,
		JSONEncoder:           encodeJSON,
		ReadTimeout:           30 * time.Second,
		WriteTimeout:          s.writeTimeout,
		IdleTimeout:           120 * time.Second,
	})
	// The batch route's larger body limit (api_batch.go); every other route keeps BodyLimit.
	s.app.Server().HeaderReceived = headerReceived
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s.metrics = newMetrics(reg)
	reg.MustRegister(newPoolCollector(cfg.Database.PoolStats))
	s.obs = &observer{metrics: s.metrics, traceKeys: cfg.TraceKeys}
	s.adm = cfg.Admission.WithObserver(s.obs)
	registerGroupStats(reg, s.adm.GroupStats)
	var webhookStats func() services.WebhookStats
	if cfg.Dispatcher != nil {
		webhookStats = cfg.Dispatcher.Stats
	}
	registerWebhookStats(reg, webhookStats)
	s.webhooks = cfg.Webhooks
	if cfg.Awaiter != nil {
		registerWaiters(reg, cfg.Awaiter)
	}
	s.recon = cfg.Reconciliation.WithObserver(s.obs)
	s.reads, s.dash, s.audit = cfg.Reads, cfg.Dashboard, cfg.Audit
	reg.MustRegister(newReconciliationCollector(s.dash.NeedsReconciliationByTenant, s.log))
	s.sessions = session.New(session.Config{
		Storage:        cfg.Sessions,
		Expiration:     12 * time.Hour,
		KeyLookup:      "cookie:idemgate_session",
		CookieHTTPOnly: true,
		CookieSameSite: fiber.CookieSameSiteLaxMode,
		CookieSecure:   cfg.SecureCookies,
		CookiePath:     "/",
	})

	// Order matters: the request id first, so that everything after it (and every log line)
	// has it; then observe, which turns errors into responses and so sees every final status;
	// recover innermost, so a panic becomes an error that observe answers and logs.
	s.app.Use(securityHeaders)
	if cfg.TracerProvider != nil {
		s.app.Use(traceRequests(cfg.TracerProvider, telemetry.Propagator(), cfg.TraceKeys))
	}
	s.app.Use(assignRequestID)
	s.app.Use(s.observe)
	s.app.Use(recover.New(recover.Config{EnableStackTrace: true, StackTraceHandler: s.logPanic}))
	s.app.Use(rejectAmbiguousLength)
	s.app.Use(rejectUnstorableParams)
	s.app.Use(s.storeDeadline)
	s.routes(metricsGuard(cfg.MetricsToken), adaptor.HTTPHandler(promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		// OpenMetrics when the scraper asks for it (Accept: application/openmetrics-text):
		// only that format carries the latency histogram's trace-id exemplars.
		EnableOpenMetrics: true})))
	return s
}

// Observer returns the server's services.Observer (metrics and spans), for the reaper that
// runs beside it (services.Reaper.WithObserver): its passes then show in the server's /metrics.
func (s *Server) Observer() services.Observer { return s.obs }

// Serve serves on an already bound listener until Shutdown.
func (s *Server) Serve(ln net.Listener) error { return s.app.Listener(ln) }

// Shutdown stops accepting connections and waits for in-flight requests until ctx ends.
// Waiting operation reads are released first: they answer with the operation's state now.
func (s *Server) Shutdown(ctx context.Context) error {
	if s.awaiter != nil {
		s.awaiter.Close()
	}
	err := s.app.ShutdownWithContext(ctx)
	if perr := s.player.Close(); err == nil {
		err = perr
	}
	return err
}

func (s *Server) handleHealthz(c *fiber.Ctx) error {
	return c.JSON(fiber.Map{"status": "ok"})
}

func (s *Server) handleReadyz(c *fiber.Ctx) error {
	ctx, cancel := context.WithTimeout(c.UserContext(), 2*time.Second)
	defer cancel()
	if err := s.db.Ping(ctx); err != nil {
		return err
	}
	return c.JSON(fiber.Map{"status": "ok"})
}
