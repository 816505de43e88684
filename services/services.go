package services

import (
	"log/slog"
	"time"

	"github.com/idemgate/idemgate/models"
)

// Services is every service of one idemgate process over one database, each built once by New:
// what `idemgate serve` runs and what the HTTP layer (web.Config) is given.
type Services struct {
	// Admission decides the API's acquires, outcomes, releases and renewals (the hot path).
	Admission *Admission
	// Reads answers a tenant's API reads.
	Reads *Reads
	// Reconciliation carries out operators' confirmed outcomes and releases.
	Reconciliation *Reconciliation
	// Dashboard answers the dashboard's pages.
	Dashboard *Dashboard
	// Audit answers the Audit page and its CSV export.
	Audit *Audit
	// Auth authenticates API keys and operators.
	Auth *Auth
	// Accounts administers API keys, tenants and operator accounts. It is wired to Auth: a key
	// revoked through it is refused by Auth at once.
	Accounts *Accounts
	// Sessions stores dashboard sessions in the database (fiber.Storage).
	Sessions *SessionStore
	// Webhooks manages webhook endpoints and reads the delivery log.
	Webhooks *Webhooks
	// Awaiter lets operation reads wait for an outcome; its Run must be running for a wait to
	// end before its time.
	Awaiter *Awaiter
	// Reaper expires holds and purges old evidence; its Run (or RunOnce) is the caller's to
	// start.
	Reaper *Reaper
	// Dispatcher delivers webhooks when its Run is running; nil unless Options.Dispatch.
	Dispatcher *Dispatcher
	// Policies stores tenants' lifecycle policies; Admission applies them through it.
	Policies *Policies
	// Database pings the database and reads its connection pool's counters (/readyz, /metrics).
	Database *Database
}

// Options is what differs between the processes and tests that build Services. The zero value
// takes every default, with group admission off and no webhook dispatcher.
type Options struct {
	// MaxTTL is the largest ttl_seconds acquires accept (0: DefaultMaxTTL; above MaxTTL it is
	// cut to MaxTTL). IDEMGATE_MAX_TTL.
	MaxTTL time.Duration
	// GroupAdmission gathers concurrent acquires into one statement and commit
	// (Admission.WithGroupAdmission). IDEMGATE_GROUP_ADMISSION.
	GroupAdmission bool
	// GroupLinger is how group admission's statement slot lingers (LingerMode; the zero value
	// is LingerOff). IDEMGATE_GROUP_LINGER.
	GroupLinger LingerMode
	// Retention is how long the reaper keeps the evidence of ended operations (0:
	// DefaultRetention). IDEMGATE_RETENTION.
	Retention time.Duration
	// StoreTimeout is the deadline of each session store call (0: DefaultSessionStoreTimeout).
	// IDEMGATE_STORE_TIMEOUT.
	StoreTimeout time.Duration
	// MaxWaiters bounds the operation reads waiting at once (0: DefaultMaxWaiters).
	// IDEMGATE_MAX_WAITERS.
	MaxWaiters int
	// ListenURL is the PostgreSQL URL of the Awaiter's LISTEN connection ("": the pool's).
	// IDEMGATE_LISTEN_DATABASE_URL.
	ListenURL string
	// NoListen keeps the Awaiter from LISTENing at all (AwaiterConfig.NoListen).
	// IDEMGATE_LISTEN=false.
	NoListen bool
	// WebhookAllowPrivate lets webhook endpoints, and so deliveries, name private addresses.
	// IDEMGATE_WEBHOOK_ALLOW_PRIVATE.
	WebhookAllowPrivate bool
	// Dispatch builds Services.Dispatcher. IDEMGATE_WEBHOOKS.
	Dispatch bool
	// WebhookPoll is the Dispatcher's pause when nothing is due (0: DefaultWebhookPoll).
	// IDEMGATE_WEBHOOK_POLL_INTERVAL.
	WebhookPoll time.Duration
	// WebhookTimeout bounds one delivery attempt (0: DefaultWebhookTimeout).
	// IDEMGATE_WEBHOOK_TIMEOUT.
	WebhookTimeout time.Duration
}

// New builds every service over db once, as opts says. log receives the services' logs (nil:
// nothing is logged). Nothing runs yet: Awaiter.Run, Reaper.Run and Dispatcher.Run are the
// caller's to start, and the HTTP layer gives Admission, Reconciliation and the Reaper their
// Observer.
func New(db *models.DB, log *slog.Logger, opts Options) *Services {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	auth := NewAuth(db, log)
	policies := NewPolicies(db, log).WithRetention(opts.Retention).WithMaxTTL(opts.MaxTTL)
	s := &Services{
		Admission: NewAdmission(db, log, opts.MaxTTL).WithPolicies(policies).WithLinger(opts.GroupLinger).
			WithGroupAdmission(opts.GroupAdmission),
		Policies:       policies,
		Reads:          NewReads(db),
		Reconciliation: NewReconciliation(db),
		Dashboard:      NewDashboard(db),
		Audit:          NewAudit(db),
		Auth:           auth,
		Accounts:       NewAccounts(db, log, auth),
		Sessions:       NewSessionStore(db).WithTimeout(opts.StoreTimeout),
		Webhooks:       NewWebhooks(db, log, opts.WebhookAllowPrivate),
		Awaiter: NewAwaiter(db, AwaiterConfig{MaxWaiters: opts.MaxWaiters, ListenURL: opts.ListenURL, NoListen: opts.NoListen,
			Log: log}),
		Reaper:   NewReaper(db, log, opts.Retention),
		Database: NewDatabase(db),
	}
	if opts.Dispatch {
		s.Dispatcher = NewDispatcher(db, log, DispatcherConfig{Poll: opts.WebhookPoll, Timeout: opts.WebhookTimeout,
			AllowPrivate: opts.WebhookAllowPrivate})
	}
	return s
}
