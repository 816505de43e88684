package web

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/models/modeltest"
	"github.com/stretchr/testify/require"
)

// serveForReal runs s on a loopback listener (a real HTTP server, real sockets: back-pressure
// from a slow client reaches the handler as it would in production) and returns its base URL.
func serveForReal(t *testing.T, s *Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
	})
	return "http://" + ln.Addr().String()
}

// stalledDownload starts GET path with the session cookie over a raw TCP connection whose
// receive buffer is small, reads the status line and then stops reading, as a slow or stuck
// client does; the connection stays open until the test ends.
func stalledDownload(t *testing.T, base, path, cookie string) {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	conn, err := d.Dial("tcp", strings.TrimPrefix(base, "http://"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	_, err = fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: idemgate\r\nCookie: %s\r\nAccept: text/csv\r\n\r\n", path, cookie)
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(30*time.Second)))
	line, err := bufio.NewReaderSize(conn, 64).ReadString('\n')
	require.NoError(t, err)
	require.Contains(t, line, "200", "the export started")
}

// TestSlowCSVDownloadsDoNotStarveAcquires: more stalled /audit.csv downloads than the
// database pool has connections must not stop admission. Each download's rows are far more
// than the socket buffers hold, so every export is blocked writing to its client; acquires
// made meanwhile must still be admitted, each within the store deadline (an acquire that
// waited for a connection held by an export would be answered 503 store_unavailable).
func TestSlowCSVDownloadsDoNotStarveAcquires(t *testing.T) {
	ctx := context.Background()
	pgURL, drop, err := modeltest.CreatePostgres()
	require.NoError(t, err)
	t.Cleanup(drop)
	for _, tc := range []struct {
		name string
		opts models.OpenOptions
	}{
		{"postgres", models.OpenOptions{DatabaseURL: pgURL, MaxConns: 3}},
		{"sqlite", models.OpenOptions{SQLitePath: filepath.Join(t.TempDir(), "export.db")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, err := models.Open(ctx, tc.opts)
			require.NoError(t, err)
			t.Cleanup(func() { _ = db.Close() })
			_, err = models.Migrate(ctx, db, nil)
			require.NoError(t, err)
			sqlDB, err := db.SQL()
			require.NoError(t, err)
			poolSize := sqlDB.Stats().MaxOpenConnections
			if db.Pool != nil {
				poolSize = int(db.Pool.Config().MaxConns)
			}
			require.Positive(t, poolSize)

			cfg := testConfig(t, db, slog.New(slog.NewTextHandler(io.Discard, nil)))
			cfg.StoreTimeout = 3 * time.Second
			// Above the default cap on exports: what is tested here is that a running export
			// holds no connection while it writes, however many run.
			cfg.MaxConcurrentExports = poolSize + 2
			s := New(cfg)
			base := serveForReal(t, s)
			_, p := dashTenant(t, s)
			secret, err := s.auth.CreateAPIKey(ctx, "acquirer-"+dashRandom(), "export test", "")
			require.NoError(t, err)

			// ~16 MB of CSV: many times what the socket buffers between server and client hold.
			now := time.Now().UTC().Truncate(time.Microsecond)
			rows := make([]models.Attempt, 0, 30000)
			fp, corr := strings.Repeat("f", 256), strings.Repeat("c", 128)
			for i := 0; i < cap(rows); i++ {
				rows = append(rows, models.Attempt{TenantID: p.TenantID, Key: fmt.Sprintf("%s-%06d", strings.Repeat("k", 100), i),
					Result: models.ResultDuplicate, Fingerprint: &fp, CorrelationID: &corr, Caller: "idg_test", AttemptedAt: now.Add(-time.Minute)})
			}
			require.NoError(t, db.CreateInBatches(rows, 500).Error)

			b := newDashBrowser(t, s)
			b.mustLogin(dashOperator(t, db, models.RoleAuditor, nil))
			var cookie []string
			for _, c := range b.cookies {
				cookie = append(cookie, c.Name+"="+c.Value)
			}
			for i := 0; i < poolSize+2; i++ {
				stalledDownload(t, base, "/audit.csv", strings.Join(cookie, "; "))
			}
			time.Sleep(500 * time.Millisecond) // let every export run into its full socket

			client := &http.Client{Timeout: 30 * time.Second}
			var took []time.Duration
			for i := 0; i < 10; i++ {
				req, _ := http.NewRequest(http.MethodPost, base+"/v1/acquire",
					strings.NewReader(fmt.Sprintf(`{"key":"during-exports-%d","ttl_seconds":60}`, i)))
				req.Header.Set("Authorization", "Bearer "+secret)
				req.Header.Set("Content-Type", "application/json")
				start := time.Now()
				resp, err := client.Do(req)
				require.NoError(t, err)
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				took = append(took, time.Since(start))
				require.Equal(t, http.StatusCreated, resp.StatusCode, "acquire %d with %d stalled downloads on a pool of %d: %s",
					i, poolSize+2, poolSize, body)
			}
			sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
			t.Logf("%s: %d stalled downloads, pool %d: acquire latency median %v max %v", tc.name, poolSize+2, poolSize,
				took[len(took)/2], took[len(took)-1])
		})
	}
}
