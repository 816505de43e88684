package cli

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemgate/idemgate/services"
	"github.com/stretchr/testify/require"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestLoadConfigDefaults(t *testing.T) {
	c, err := LoadConfig(env(nil))
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:8080", c.Addr)
	require.Equal(t, "./idemgate.db", c.SQLitePath)
	require.Equal(t, 30*24*time.Hour, c.MaxTTL)
	require.Equal(t, 90*24*time.Hour, c.Retention)
	require.Equal(t, 30*time.Second, c.ReapInterval)
	require.Equal(t, 16, c.DBMaxConns)
	require.Equal(t, slog.LevelInfo, c.LogLevel)
	require.Equal(t, 5*time.Second, c.StoreTimeout)
	require.Equal(t, 60*time.Second, c.StartTimeout)
}

// TestLoadConfigStoreTimeouts: the database deadline is configurable within a range where it
// neither refuses a healthy database nor waits out a stalled one, and start-up retries at
// least one deadline's worth.
func TestLoadConfigStoreTimeouts(t *testing.T) {
	c, err := LoadConfig(env(map[string]string{"IDEMGATE_STORE_TIMEOUT": "1500ms", "IDEMGATE_START_TIMEOUT": "2m"}))
	require.NoError(t, err)
	require.Equal(t, 1500*time.Millisecond, c.StoreTimeout)
	require.Equal(t, 2*time.Minute, c.StartTimeout)
	for _, bad := range []map[string]string{
		{"IDEMGATE_STORE_TIMEOUT": "50ms"},
		{"IDEMGATE_STORE_TIMEOUT": "11m"},
		{"IDEMGATE_STORE_TIMEOUT": "0"},
		{"IDEMGATE_STORE_TIMEOUT": "soon"},
		{"IDEMGATE_START_TIMEOUT": "-5s"},
		{"IDEMGATE_STORE_TIMEOUT": "10s", "IDEMGATE_START_TIMEOUT": "5s"},
	} {
		_, err := LoadConfig(env(bad))
		require.Error(t, err, "%v", bad)
		require.Contains(t, err.Error(), "_TIMEOUT", "%v", bad)
	}
}

// TestLoadConfigReapInterval: a reaper interval under a second is refused (1ns ran ~4,700
// passes a second).
func TestLoadConfigReapInterval(t *testing.T) {
	for _, bad := range []string{"1ns", "999ms"} {
		_, err := LoadConfig(env(map[string]string{"IDEMGATE_REAP_INTERVAL": bad}))
		require.ErrorContains(t, err, "IDEMGATE_REAP_INTERVAL", bad)
	}
	c, err := LoadConfig(env(map[string]string{"IDEMGATE_REAP_INTERVAL": "1s"}))
	require.NoError(t, err)
	require.Equal(t, time.Second, c.ReapInterval)
}

func TestLoadConfigParsesAndReportsEveryProblem(t *testing.T) {
	c, err := LoadConfig(env(map[string]string{"IDEMGATE_MAX_TTL": "7d", "IDEMGATE_RETENTION": "36h", "IDEMGATE_REAP_INTERVAL": "5",
		"IDEMGATE_LOG_LEVEL": "DEBUG", "IDEMGATE_METRICS_TOKEN": "prometheus_scrape_token_0123"}))
	require.NoError(t, err)
	require.Equal(t, slog.LevelDebug, c.LogLevel)
	require.Equal(t, "prometheus_scrape_token_0123", c.MetricsToken)
	require.Equal(t, 7*24*time.Hour, c.MaxTTL)
	require.Equal(t, 36*time.Hour, c.Retention)
	require.Equal(t, 5*time.Second, c.ReapInterval)

	_, err = LoadConfig(env(map[string]string{"IDEMGATE_MAX_TTL": "soon", "IDEMGATE_DB_MAX_CONNS": "0",
		"IDEMGATE_BOOTSTRAP_API_KEY": "short", "IDEMGATE_ADMIN_PASSWORD": "tiny", "IDEMGATE_LOG_FORMAT": "xml",
		"IDEMGATE_LOG_LEVEL": "loud", "IDEMGATE_METRICS_TOKEN": "short token"}))
	require.Error(t, err)
	for _, name := range []string{"IDEMGATE_MAX_TTL", "IDEMGATE_DB_MAX_CONNS", "IDEMGATE_BOOTSTRAP_API_KEY", "IDEMGATE_ADMIN_PASSWORD", "IDEMGATE_LOG_FORMAT", "IDEMGATE_LOG_LEVEL",
		"IDEMGATE_METRICS_TOKEN"} {
		require.Contains(t, err.Error(), name)
	}
}

// TestLoadConfigRefusesMaxTTLBeyondStores: IDEMGATE_MAX_TTL above services.MaxTTL (2^31-1
// seconds, what PostgreSQL's integer TTL parameter holds) is refused at start with the
// variable's name and the ceiling, and serve stops before it opens or migrates a database (the
// SQLite file is never created). The ceiling itself is accepted.
func TestLoadConfigRefusesMaxTTLBeyondStores(t *testing.T) {
	for _, v := range []string{"2147483648", "24856d", "596524h"} {
		_, err := LoadConfig(env(map[string]string{"IDEMGATE_MAX_TTL": v}))
		require.ErrorContains(t, err, "IDEMGATE_MAX_TTL", v)
		require.ErrorContains(t, err, "2147483647", v)
	}
	c, err := LoadConfig(env(map[string]string{"IDEMGATE_MAX_TTL": "2147483647"}))
	require.NoError(t, err)
	require.Equal(t, services.MaxTTL, c.MaxTTL)

	path := filepath.Join(t.TempDir(), "never.db")
	_, _, err = run(t, map[string]string{"IDEMGATE_SQLITE_PATH": path, "IDEMGATE_MAX_TTL": "24856d"}, "", "serve")
	require.ErrorContains(t, err, "IDEMGATE_MAX_TTL")
	_, statErr := os.Stat(path)
	require.True(t, os.IsNotExist(statErr), "the database was opened: %v", statErr)
}

// TestLoadConfigPprofAddr: the profiler is off unless asked for, and only ever on loopback.
func TestLoadConfigPprofAddr(t *testing.T) {
	c, err := LoadConfig(env(nil))
	require.NoError(t, err)
	require.Empty(t, c.PprofAddr)
	for _, ok := range []string{"127.0.0.1:6060", "[::1]:6060", "localhost:6060", "127.0.0.2:0"} {
		c, err := LoadConfig(env(map[string]string{"IDEMGATE_PPROF_ADDR": ok}))
		require.NoError(t, err, ok)
		require.Equal(t, ok, c.PprofAddr)
	}
	for _, bad := range []string{":6060", "0.0.0.0:6060", "10.0.0.1:6060", "example.com:6060", "127.0.0.1", "[::]:6060"} {
		_, err := LoadConfig(env(map[string]string{"IDEMGATE_PPROF_ADDR": bad}))
		require.ErrorContains(t, err, "IDEMGATE_PPROF_ADDR", bad)
	}
}

// TestLoadConfigWebhooks: the dispatcher is on by default, with a 1 s poll and a 10 s attempt
// limit; each setting is checked.
func TestLoadConfigWebhooks(t *testing.T) {
	c, err := LoadConfig(env(nil))
	require.NoError(t, err)
	require.True(t, c.Webhooks)
	require.Equal(t, time.Second, c.WebhookPoll)
	require.Equal(t, 10*time.Second, c.WebhookTimeout)
	c, err = LoadConfig(env(map[string]string{"IDEMGATE_WEBHOOKS": "false", "IDEMGATE_WEBHOOK_POLL_INTERVAL": "250ms",
		"IDEMGATE_WEBHOOK_TIMEOUT": "2s"}))
	require.NoError(t, err)
	require.False(t, c.Webhooks)
	require.Equal(t, 250*time.Millisecond, c.WebhookPoll)
	require.Equal(t, 2*time.Second, c.WebhookTimeout)
	for name, bad := range map[string]string{"IDEMGATE_WEBHOOKS": "maybe", "IDEMGATE_WEBHOOK_POLL_INTERVAL": "10ms",
		"IDEMGATE_WEBHOOK_TIMEOUT": "2m"} {
		_, err := LoadConfig(env(map[string]string{name: bad}))
		require.ErrorContains(t, err, name)
	}
}

// TestLoadConfigWaiters: IDEMGATE_MAX_WAITERS bounds waiting requests (default 1000), and the
// LISTEN connection uses DATABASE_URL unless IDEMGATE_LISTEN_DATABASE_URL names another.
func TestLoadConfigWaiters(t *testing.T) {
	c, err := LoadConfig(env(map[string]string{"DATABASE_URL": "postgres://pgbouncer:6432/db"}))
	require.NoError(t, err)
	require.Equal(t, services.DefaultMaxWaiters, c.MaxWaiters)
	require.Equal(t, "postgres://pgbouncer:6432/db", c.ListenDatabaseURL)
	c, err = LoadConfig(env(map[string]string{"DATABASE_URL": "postgres://pgbouncer:6432/db",
		"IDEMGATE_LISTEN_DATABASE_URL": "postgres://pg:5432/db", "IDEMGATE_MAX_WAITERS": "5"}))
	require.NoError(t, err)
	require.Equal(t, 5, c.MaxWaiters)
	require.Equal(t, "postgres://pg:5432/db", c.ListenDatabaseURL)
	for _, bad := range []string{"0", "-1", "many", "1000001"} {
		_, err := LoadConfig(env(map[string]string{"IDEMGATE_MAX_WAITERS": bad}))
		require.ErrorContains(t, err, "IDEMGATE_MAX_WAITERS", bad)
	}
}

// TestListenSwitch: IDEMGATE_LISTEN is on unless set to false (issue 31: engines without
// LISTEN/NOTIFY), and anything but a boolean is refused with the variable's name.
func TestListenSwitch(t *testing.T) {
	c, err := LoadConfig(env(map[string]string{}))
	require.NoError(t, err)
	require.True(t, c.Listen)
	c, err = LoadConfig(env(map[string]string{"IDEMGATE_LISTEN": "false"}))
	require.NoError(t, err)
	require.False(t, c.Listen)
	_, err = LoadConfig(env(map[string]string{"IDEMGATE_LISTEN": "off"}))
	require.ErrorContains(t, err, "IDEMGATE_LISTEN")
}
