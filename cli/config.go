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
	StoreTimeout    time.Duration // IDEMGATE_STORE_TIMEOUT, deadline of each request's (and each connection attempt's) database work, default 5s
	StartTimeout    time.Duration // IDEMGATE_START_TIMEOUT, how long start-up keeps retrying an unreachable database, default 60s
	MetricsToken    string        // IDEMGATE_METRICS_TOKEN, when set GET /metrics needs "Authorization: Bearer <it>"; default none
	// PprofAddr is IDEMGATE_PPROF_ADDR: when set, a loopback address (127.0.0.1:6060,
	// [::1]:6060, localhost:6060) where Go's profiler (net/http/pprof, /debug/pprof/) is served
	// on a listener of its own, with block and mutex profiling sampled. Default none: off.
	PprofAddr string
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

// LoadConfig reads Config through getenv and validates it; every problem is reported at once.
func LoadConfig(getenv func(string) string) (Config, error) {
	c := Config{
		Addr:            or(getenv("IDEMGATE_ADDR"), "127.0.0.1:8080"),
		DatabaseURL:     getenv("DATABASE_URL"),
		SQLitePath:      or(getenv("IDEMGATE_SQLITE_PATH"), "./idemgate.db"),
		AdminPassword:   getenv("IDEMGATE_ADMIN_PASSWORD"),
		BootstrapAPIKey: getenv("IDEMGATE_BOOTSTRAP_API_KEY"),
		LogFormat:       getenv("IDEMGATE_LOG_FORMAT"),
		MetricsToken:    getenv("IDEMGATE_METRICS_TOKEN"),
		PprofAddr:       getenv("IDEMGATE_PPROF_ADDR"),
	}
	var errs []error
	dur := func(name string, def time.Duration, dst *time.Duration) {
		*dst = def
		if v := getenv(name); v != "" {
			d, err := parseDuration(v)
			if err != nil || d <= 0 {
				errs = append(errs, fmt.Errorf("%s=%q: want a positive duration such as 30s, 12h or 30d", name, v))
				return
			}
			*dst = d
		}
	}
	dur("IDEMGATE_MAX_TTL", services.DefaultMaxTTL, &c.MaxTTL)
	dur("IDEMGATE_RETENTION", services.DefaultRetention, &c.Retention)
	dur("IDEMGATE_REAP_INTERVAL", 30*time.Second, &c.ReapInterval)
	dur("IDEMGATE_SHUTDOWN_TIMEOUT", 10*time.Second, &c.ShutdownTimeout)
	dur("IDEMGATE_STORE_TIMEOUT", DefaultStoreTimeout, &c.StoreTimeout)
	dur("IDEMGATE_START_TIMEOUT", 60*time.Second, &c.StartTimeout)
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
	c.GroupAdmission = true
	if v := getenv("IDEMGATE_GROUP_ADMISSION"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("IDEMGATE_GROUP_ADMISSION=%q: want true or false", v))
		}
		c.GroupAdmission = b
	}
	c.ListenDatabaseURL = or(getenv("IDEMGATE_LISTEN_DATABASE_URL"), c.DatabaseURL)
	c.MaxWaiters = services.DefaultMaxWaiters
	if v := getenv("IDEMGATE_MAX_WAITERS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000000 {
			errs = append(errs, fmt.Errorf("IDEMGATE_MAX_WAITERS=%q: want an integer from 1 to 1000000", v))
		}
		c.MaxWaiters = n
	}
	c.DBMaxConns = 16
	if v := getenv("IDEMGATE_DB_MAX_CONNS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			errs = append(errs, fmt.Errorf("IDEMGATE_DB_MAX_CONNS=%q: want an integer from 1 to 1000", v))
		}
		c.DBMaxConns = n
	}
	if v := getenv("IDEMGATE_SECURE_COOKIES"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("IDEMGATE_SECURE_COOKIES=%q: want true or false", v))
		}
		c.SecureCookies = b
	}
	switch c.LogFormat {
	case "", "json", "text":
	default:
		errs = append(errs, fmt.Errorf("IDEMGATE_LOG_FORMAT=%q: want json or text", c.LogFormat))
	}
	if v := getenv("IDEMGATE_LOG_LEVEL"); v != "" {
		switch strings.ToLower(v) {
		case "debug":
			c.LogLevel = slog.LevelDebug
		case "info":
			c.LogLevel = slog.LevelInfo
		case "warn":
			c.LogLevel = slog.LevelWarn
		case "error":
			c.LogLevel = slog.LevelError
		default:
			errs = append(errs, fmt.Errorf("IDEMGATE_LOG_LEVEL=%q: want debug, info, warn or error", v))
		}
	}
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
	return c, errors.Join(errs...)
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

func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// parseDuration accepts "30d", Go durations, and bare seconds.
func parseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		if n < 0 || n > 100*365*24*3600 {
			return 0, fmt.Errorf("seconds out of range: %q", s)
		}
		return time.Duration(n) * time.Second, nil
	}
	if d, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseFloat(d, 64)
		if err != nil || n < 0 || n > 100*365 {
			return 0, fmt.Errorf("days out of range: %q", s)
		}
		return time.Duration(n * float64(24*time.Hour)), nil
	}
	return time.ParseDuration(s)
}
