package cli

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/idemgate/idemgate/services"
)

// Config is idemgate's configuration, read from the environment (docs/reference.md §7). Durations accept
// Go syntax ("90s", "36h"), a day suffix ("30d") or a bare number of seconds.
type Config struct {
	Addr            string        // IDEMGATE_ADDR, default 127.0.0.1:8080
	DatabaseURL     string        // DATABASE_URL; PostgreSQL when set, else SQLite
	SQLitePath      string        // IDEMGATE_SQLITE_PATH, default ./idemgate.db
	DBMaxConns      int           // IDEMGATE_DB_MAX_CONNS, PostgreSQL pool size, default 16
	MaxTTL          time.Duration // IDEMGATE_MAX_TTL, largest ttl_seconds, default 30d, at most services.MaxTTL (2^31-1 s)
	Retention       time.Duration // IDEMGATE_RETENTION, evidence kept after an operation ends, default 90d
	ReapInterval    time.Duration // IDEMGATE_REAP_INTERVAL, time between reaper passes, default 30s
	AdminPassword   string        // IDEMGATE_ADMIN_PASSWORD, bootstrap admin password (else generated)
	BootstrapAPIKey string        // IDEMGATE_BOOTSTRAP_API_KEY, bootstrap API key (else generated)
	SecureCookies   bool          // IDEMGATE_SECURE_COOKIES, mark dashboard cookies Secure (behind TLS), default false
	LogFormat       string        // IDEMGATE_LOG_FORMAT, "json" or "text"; default text on a terminal, else json
	LogLevel        slog.Level    // IDEMGATE_LOG_LEVEL, debug, info, warn or error; default info
	ShutdownTimeout time.Duration // IDEMGATE_SHUTDOWN_TIMEOUT, how long SIGTERM waits for in-flight requests, default 10s
	GroupAdmission  bool          // IDEMGATE_GROUP_ADMISSION, gather concurrent acquires into one statement and commit (both databases), default true
	// GroupLinger is IDEMGATE_GROUP_LINGER: whether group admission's slot waits, after a
	// statement of several acquires with fewer than 16 waiting, for the callers it answered to
	// come back (at most as long as that statement took, at most 5 ms): off (default), on, or
	// auto (backs off while lingers gather less than half of what they wait for). See
	// services.LingerMode.
	GroupLinger  services.LingerMode
	StoreTimeout time.Duration // IDEMGATE_STORE_TIMEOUT, deadline of each request's (and each connection attempt's) database work, default 5s
	StartTimeout time.Duration // IDEMGATE_START_TIMEOUT, how long start-up keeps retrying an unreachable database, default 60s
	MetricsToken string        // IDEMGATE_METRICS_TOKEN, when set GET /metrics needs "Authorization: Bearer <it>"; default none
	// Webhooks is IDEMGATE_WEBHOOKS: run a webhook dispatcher in this process (docs/reference.md
	// §10), default true. Events are written to the outbox either way; turn it off on instances
	// that should not make outbound calls, as long as one instance delivers.
	Webhooks bool
	// Listen is IDEMGATE_LISTEN, default true: the instance keeps one LISTEN connection to wake
	// waiting requests at once. false is for engines and poolers without LISTEN/NOTIFY: waiters
	// then learn of outcomes by polling, every 100 ms.
	Listen bool
	// WebhookPoll is IDEMGATE_WEBHOOK_POLL_INTERVAL, how often an idle dispatcher looks for due
	// deliveries, default 1s, from 100ms to 1h.
	WebhookPoll time.Duration
	// WebhookTimeout is IDEMGATE_WEBHOOK_TIMEOUT, the limit of one delivery attempt, default
	// 10s, from 1s to 60s. A claim's lease is three times it.
	WebhookTimeout time.Duration
	// WebhookAllowPrivate is IDEMGATE_WEBHOOK_ALLOW_PRIVATE: webhook endpoints may be private
	// addresses (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7), default false.
	WebhookAllowPrivate bool
	// PprofAddr is IDEMGATE_PPROF_ADDR: when set, a loopback address (127.0.0.1:6060,
	// [::1]:6060, localhost:6060) where Go's profiler (net/http/pprof, /debug/pprof/) is served
	// on a listener of its own, with block and mutex profiling sampled. Default none: off.
	PprofAddr string
	// TraceKeys is IDEMGATE_TRACE_KEYS: raw idempotency keys on trace spans (else only their
	// hash), default false. Tracing itself is configured by the standard OTEL_* variables.
	TraceKeys bool
	// MaxWaiters is IDEMGATE_MAX_WAITERS: how many GET /v1/operations/{id}?wait= requests one
	// instance lets wait at once (docs/reference.md §8), default 1000; one more is 503
	// too_many_waiters.
	MaxWaiters int
	// ListenDatabaseURL is IDEMGATE_LISTEN_DATABASE_URL: the PostgreSQL URL of the one LISTEN
	// connection that tells waiting requests of outcomes, default DATABASE_URL. Point it at
	// PostgreSQL directly when DATABASE_URL goes through PgBouncer in transaction mode, where
	// LISTEN does not work (waiters then rely on polling).
	ListenDatabaseURL string
}

// DefaultStoreTimeout is IDEMGATE_STORE_TIMEOUT's default: the longest a request waits on the
// database before it is answered 503 store_unavailable. A healthy database answers idemgate's
// statements in milliseconds; a stalled one (connection open, no bytes) would otherwise hold
// every caller for the whole stall.
const DefaultStoreTimeout = 5 * time.Second

// Variable is one environment variable of serve's configuration, a row of Variables.
type Variable struct {
	Name string
	// Default is the value used when the variable is unset or empty; LoadConfig parses it like
	// a set value, so the default shown and the default applied are one string. "" for a
	// variable without a default value (see Shown).
	Default string
	// Shown, when set, is what help and docs/operations.md show as the default of a variable whose
	// default is not a value ("generated", "none", "text on a terminal, else json").
	Shown string
	// Meaning is a one-line summary for `serve --help`; docs/operations.md's Configuration table
	// explains more.
	Meaning string
}

// ShownDefault is v's default as help and docs/operations.md's Configuration table show it.
func (v Variable) ShownDefault() string {
	if v.Shown != "" {
		return v.Shown
	}
	return v.Default
}

// Variables is THE table of serve's configuration: LoadConfig reads only these variables and
// takes their defaults from here, `serve --help` prints it, and a test compares it with
// docs/operations.md's Configuration table, so the three cannot drift apart.
var Variables = []Variable{
	{Name: "IDEMGATE_ADDR", Default: "127.0.0.1:8080", Meaning: "listen address (host:port)"},
	{Name: "DATABASE_URL", Shown: "none", Meaning: "PostgreSQL URL, direct or through PgBouncer; unset: SQLite"},
	{Name: "IDEMGATE_SQLITE_PATH", Default: "./idemgate.db", Meaning: "SQLite file (single process only); its directory must exist"},
	{Name: "IDEMGATE_DB_MAX_CONNS", Default: "16", Meaning: "PostgreSQL pool size per process (1-1000)"},
	{Name: "IDEMGATE_GROUP_ADMISSION", Default: "true", Meaning: "decide concurrent acquires together, one statement and commit"},
	{Name: "IDEMGATE_GROUP_LINGER", Default: "off", Meaning: "group admission waits for answered callers to come back: off, on, or auto (backs off when they do not)"},
	{Name: "IDEMGATE_MAX_TTL", Default: "30d", Meaning: "largest ttl_seconds accepted (at most 2147483647 s)"},
	{Name: "IDEMGATE_RETENTION", Default: "90d", Meaning: "how long ended operations, attempts and events are kept"},
	{Name: "IDEMGATE_REAP_INTERVAL", Default: "30s", Meaning: "time between reaper passes (at least 1s)"},
	{Name: "IDEMGATE_ADMIN_PASSWORD", Shown: "generated", Meaning: "password of the first admin account; ignored once an account exists"},
	{Name: "IDEMGATE_BOOTSTRAP_API_KEY", Shown: "generated", Meaning: "the first API key (tenant default), 24-128 of [A-Za-z0-9_-]"},
	{Name: "IDEMGATE_SECURE_COOKIES", Default: "false", Meaning: "mark dashboard cookies Secure (behind TLS)"},
	{Name: "IDEMGATE_LOG_FORMAT", Shown: "text on a terminal, else json", Meaning: "text or json"},
	{Name: "IDEMGATE_LOG_LEVEL", Default: "info", Meaning: "debug, info, warn or error"},
	{Name: "IDEMGATE_METRICS_TOKEN", Shown: "none", Meaning: "when set, GET /metrics needs Authorization: Bearer <token>"},
	{Name: "IDEMGATE_PPROF_ADDR", Shown: "none", Meaning: "loopback host:port serving Go's profiler under /debug/pprof/"},
	{Name: "IDEMGATE_TRACE_KEYS", Default: "false", Meaning: "put raw idempotency keys on trace spans (else only their hash)"},
	{Name: "IDEMGATE_SHUTDOWN_TIMEOUT", Default: "10s", Meaning: "how long SIGTERM waits for in-flight requests"},
	{Name: "IDEMGATE_STORE_TIMEOUT", Default: "5s", Meaning: "deadline of each request's database work (100ms-10m)"},
	{Name: "IDEMGATE_START_TIMEOUT", Default: "60s", Meaning: "how long start-up retries an unreachable database"},
	{Name: "IDEMGATE_MAX_WAITERS", Default: "1000", Meaning: "requests one instance lets wait (?wait=) at once (1-1000000)"},
	{Name: "IDEMGATE_LISTEN_DATABASE_URL", Shown: "DATABASE_URL", Meaning: "direct PostgreSQL URL for the LISTEN connection (behind PgBouncer)"},
	{Name: "IDEMGATE_LISTEN", Default: "true", Meaning: "LISTEN for outcomes (false: waiters poll every 100ms, for engines without LISTEN/NOTIFY)"},
	{Name: "IDEMGATE_WEBHOOKS", Default: "true", Meaning: "run a webhook dispatcher in this instance"},
	{Name: "IDEMGATE_WEBHOOK_POLL_INTERVAL", Default: "1s", Meaning: "how often an idle dispatcher looks for due deliveries (100ms-1h)"},
	{Name: "IDEMGATE_WEBHOOK_TIMEOUT", Default: "10s", Meaning: "limit of one delivery attempt (1s-60s)"},
	{Name: "IDEMGATE_WEBHOOK_ALLOW_PRIVATE", Default: "false", Meaning: "let webhook endpoints be private addresses (10/8, 192.168/16, …)"},
}

// variablesHelp lists Variables for `serve --help`: name, default, meaning.
func variablesHelp() string {
	var b strings.Builder
	b.WriteString("Environment (docs/operations.md \"Configuration\" explains each):\n")
	for _, v := range Variables {
		fmt.Fprintf(&b, "  %-27s (default %s)\n      %s\n", v.Name, v.ShownDefault(), v.Meaning)
	}
	return strings.TrimRight(b.String(), "\n")
}

// variable returns the row of Variables called name; a name missing from the table is a
// programming error, caught by every test that loads a configuration.
func variable(name string) Variable {
	for _, v := range Variables {
		if v.Name == name {
			return v
		}
	}
	panic("cli: configuration variable " + name + " is not in Variables")
}

// LoadConfig reads Config through getenv and validates it; every problem is reported at once.
// Only the variables of the Variables table are read, unset ones take its Default.
func LoadConfig(getenv func(string) string) (Config, error) {
	r := &envReader{getenv: withDefaults(getenv)}
	c := Config{
		Addr:            r.get("IDEMGATE_ADDR"),
		DatabaseURL:     r.get("DATABASE_URL"),
		SQLitePath:      r.get("IDEMGATE_SQLITE_PATH"),
		AdminPassword:   r.get("IDEMGATE_ADMIN_PASSWORD"),
		BootstrapAPIKey: r.get("IDEMGATE_BOOTSTRAP_API_KEY"),
		LogFormat:       r.get("IDEMGATE_LOG_FORMAT"),
		MetricsToken:    r.get("IDEMGATE_METRICS_TOKEN"),
		PprofAddr:       r.get("IDEMGATE_PPROF_ADDR"),
	}
	r.refuse(addrProblems(c.Addr)...)
	readDurations(r, &c)
	r.refuse(durationProblems(c)...)
	readSwitches(r, &c)
	c.ListenDatabaseURL = r.get("IDEMGATE_LISTEN_DATABASE_URL")
	if c.ListenDatabaseURL == "" {
		c.ListenDatabaseURL = c.DatabaseURL
	}
	c.MaxWaiters = r.integer("IDEMGATE_MAX_WAITERS", 1, 1000000)
	c.DBMaxConns = r.integer("IDEMGATE_DB_MAX_CONNS", 1, 1000)
	r.refuse(logFormatProblems(c.LogFormat)...)
	c.LogLevel = r.logLevel("IDEMGATE_LOG_LEVEL")
	r.refuse(accessProblems(c)...)
	return c, errors.Join(r.errs...)
}

// withDefaults is getenv with the Default of Variables for a variable unset or empty.
func withDefaults(getenv func(string) string) func(string) string {
	return func(name string) string {
		if v := getenv(name); v != "" {
			return v
		}
		return variable(name).Default
	}
}

// envReader reads variables through getenv, collecting a problem for each value it cannot
// use, so that LoadConfig reports them all at once.
type envReader struct {
	getenv func(string) string
	errs   []error
}

// get returns the variable's value.
func (r *envReader) get(name string) string { return r.getenv(name) }

// refuse records problems.
func (r *envReader) refuse(problems ...error) { r.errs = append(r.errs, problems...) }

// duration returns the variable as a positive duration (services.ParseDuration); 0 and a problem when
// it is not one.
func (r *envReader) duration(name string) time.Duration {
	v := r.getenv(name)
	d, err := services.ParseDuration(v)
	if err != nil || d <= 0 {
		r.refuse(fmt.Errorf("%s=%q: want a positive duration such as 30s, 12h or 30d", name, v))
		return 0
	}
	return d
}

// boolean returns the variable as true or false (strconv.ParseBool); false and a problem when
// it is neither.
func (r *envReader) boolean(name string) bool {
	v := r.getenv(name)
	b, err := strconv.ParseBool(v)
	if err != nil {
		r.refuse(fmt.Errorf("%s=%q: want true or false", name, v))
	}
	return b
}

// integer returns the variable as an integer from lo to hi, with a problem when it is not one
// (the number is returned even when out of range); 0 when it is empty.
func (r *envReader) integer(name string, lo, hi int) int {
	v := r.getenv(name)
	if v == "" {
		return 0
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		r.refuse(fmt.Errorf("%s=%q: want an integer from %d to %d", name, v, lo, hi))
	}
	return n
}

// logLevel returns the variable as a log level (debug, info, warn or error, in any case);
// info and a problem when it is none of them, info when it is empty.
func (r *envReader) logLevel(name string) slog.Level {
	v := r.getenv(name)
	switch strings.ToLower(v) {
	case "", "info":
		return slog.LevelInfo
	case "debug":
		return slog.LevelDebug
	case "warn":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	}
	r.refuse(fmt.Errorf("%s=%q: want debug, info, warn or error", name, v))
	return slog.LevelInfo
}

// addrProblems are what is wrong with addr as IDEMGATE_ADDR: it must be host:port.
func addrProblems(addr string) []error {
	if _, port, err := net.SplitHostPort(addr); err != nil || port == "" {
		return []error{fmt.Errorf("IDEMGATE_ADDR=%q: want host:port such as 127.0.0.1:8080 (or :8080 for every interface)", addr)}
	}
	return nil
}

// readDurations reads the duration variables into c.
func readDurations(r *envReader, c *Config) {
	c.MaxTTL = r.duration("IDEMGATE_MAX_TTL")
	c.Retention = r.duration("IDEMGATE_RETENTION")
	c.ReapInterval = r.duration("IDEMGATE_REAP_INTERVAL")
	c.ShutdownTimeout = r.duration("IDEMGATE_SHUTDOWN_TIMEOUT")
	c.StoreTimeout = r.duration("IDEMGATE_STORE_TIMEOUT")
	c.StartTimeout = r.duration("IDEMGATE_START_TIMEOUT")
	c.WebhookPoll = r.duration("IDEMGATE_WEBHOOK_POLL_INTERVAL")
	c.WebhookTimeout = r.duration("IDEMGATE_WEBHOOK_TIMEOUT")
}

// durationProblems are the durations of c outside their ranges. One that could not be read
// (0) has already been refused, so it is not refused again, except where 0 is out of range
// too.
func durationProblems(c Config) []error {
	var errs []error
	if c.WebhookPoll > 0 && (c.WebhookPoll < 100*time.Millisecond || c.WebhookPoll > time.Hour) {
		errs = append(errs, errors.New("IDEMGATE_WEBHOOK_POLL_INTERVAL must be from 100ms to 1h"))
	}
	if c.WebhookTimeout > 0 && (c.WebhookTimeout < time.Second || c.WebhookTimeout > time.Minute) {
		errs = append(errs, errors.New("IDEMGATE_WEBHOOK_TIMEOUT must be from 1s to 60s"))
	}
	// Below 100ms a healthy database on another host would be refused under ordinary load;
	// above 10 minutes a stalled database holds callers as long as no deadline at all.
	if c.StoreTimeout > 0 && (c.StoreTimeout < 100*time.Millisecond || c.StoreTimeout > 10*time.Minute) {
		errs = append(errs, errors.New("IDEMGATE_STORE_TIMEOUT must be from 100ms to 10m"))
	}
	if c.StartTimeout > 0 && c.StartTimeout < c.StoreTimeout {
		errs = append(errs, errors.New("IDEMGATE_START_TIMEOUT must be at least IDEMGATE_STORE_TIMEOUT"))
	}
	// Below a second a reaper pass would run thousands of times a second (1ns was accepted).
	if c.ReapInterval < time.Second {
		errs = append(errs, errors.New("IDEMGATE_REAP_INTERVAL must be at least 1s"))
	}
	if c.MaxTTL < time.Second {
		errs = append(errs, errors.New("IDEMGATE_MAX_TTL must be at least 1s"))
	} else if c.MaxTTL > services.MaxTTL {
		// Refused rather than cut: an operator who asked for more must learn at start that
		// ttl_seconds above the ceiling will be refused, not find out from clients' 400s.
		errs = append(errs, fmt.Errorf("IDEMGATE_MAX_TTL=%s is beyond the largest TTL the stores hold exactly: at most %d seconds (%s)",
			c.MaxTTL, services.MaxTTLSeconds, services.MaxTTL))
	}
	return errs
}

// readSwitches reads the variables that turn features on or off, and group admission's linger
// mode, into c.
func readSwitches(r *envReader, c *Config) {
	c.GroupAdmission = r.boolean("IDEMGATE_GROUP_ADMISSION")
	if m, err := services.ParseLingerMode(r.get("IDEMGATE_GROUP_LINGER")); err != nil {
		r.refuse(fmt.Errorf("IDEMGATE_GROUP_LINGER: %w", err))
	} else {
		c.GroupLinger = m
	}
	c.SecureCookies = r.boolean("IDEMGATE_SECURE_COOKIES")
	c.Webhooks = r.boolean("IDEMGATE_WEBHOOKS")
	c.WebhookAllowPrivate = r.boolean("IDEMGATE_WEBHOOK_ALLOW_PRIVATE")
	c.TraceKeys = r.boolean("IDEMGATE_TRACE_KEYS")
	c.Listen = r.boolean("IDEMGATE_LISTEN")
}

// logFormatProblems are what is wrong with format as IDEMGATE_LOG_FORMAT: json, text or "".
func logFormatProblems(format string) []error {
	switch format {
	case "", "json", "text":
		return nil
	}
	return []error{fmt.Errorf("IDEMGATE_LOG_FORMAT=%q: want json or text", format)}
}

// accessProblems are what is wrong with the variables that guard access: the metrics token,
// the profiler's address (loopback only) and the bootstrap secrets.
func accessProblems(c Config) []error {
	var errs []error
	if c.MetricsToken != "" {
		if msg := services.ValidateAPIKeySecret(c.MetricsToken); msg != "" {
			errs = append(errs, fmt.Errorf("IDEMGATE_METRICS_TOKEN %s", msg))
		}
	}
	if c.PprofAddr != "" && !loopbackAddr(c.PprofAddr) {
		// Profiles show request data in memory and let anyone stall the process (a 30 s CPU
		// profile, a full goroutine dump), so they are never offered beyond this host.
		errs = append(errs, fmt.Errorf("IDEMGATE_PPROF_ADDR=%q: want a loopback host:port such as 127.0.0.1:6060", c.PprofAddr))
	}
	if c.BootstrapAPIKey != "" {
		if msg := services.ValidateAPIKeySecret(c.BootstrapAPIKey); msg != "" {
			errs = append(errs, fmt.Errorf("IDEMGATE_BOOTSTRAP_API_KEY %s", msg))
		}
	}
	if c.AdminPassword != "" && len(c.AdminPassword) < services.MinPasswordChars {
		errs = append(errs, fmt.Errorf("IDEMGATE_ADMIN_PASSWORD must be at least %d characters", services.MinPasswordChars))
	}
	return errs
}

// loopbackAddr reports whether addr is host:port with a loopback host (localhost, 127.0.0.0/8,
// ::1) and a port.
func loopbackAddr(addr string) bool {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || port == "" {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
