package web

import (
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/models/modeltest"
	"github.com/idemgate/idemgate/services"
	"github.com/stretchr/testify/require"
)

// exportServer is a real server on a loopback socket with n wide audited attempts in its
// database, and a signed-in auditor's cookie for /audit.csv.
type exportServer struct {
	s              *Server
	base, cookie   string
	secret         string
	poolSize, rows int
}

// eachExportDialect runs fn against a real server per dialect; tweak adjusts the Config.
func eachExportDialect(t *testing.T, rows int, tweak func(*Config), fn func(t *testing.T, e exportServer)) {
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
			cfg := testConfig(t, db, slog.New(slog.NewTextHandler(io.Discard, nil)))
			cfg.StoreTimeout = 3 * time.Second
			tweak(&cfg)
			s := New(cfg)
			// A small send buffer on the server's sockets: the kernel then wakes a blocked
			// write after little progress, so the server sees the client's pace as it reads.
			lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
				return rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF, 16384) })
			}}
			ln, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
			require.NoError(t, err)
			go func() { _ = s.Serve(ln) }()
			t.Cleanup(func() {
				sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = s.Shutdown(sctx)
			})
			base := "http://" + ln.Addr().String()
			_, p := dashTenant(t, s)
			secret, err := s.accounts.CreateAPIKey(ctx, services.Installation(), "acquirer-"+dashRandom(), "export test", "")
			require.NoError(t, err)
			now := time.Now().UTC().Truncate(time.Microsecond)
			batch := make([]models.Attempt, 0, rows)
			fp, corr := strings.Repeat("f", 256), strings.Repeat("c", 128)
			for i := 0; i < rows; i++ {
				batch = append(batch, models.Attempt{TenantID: p.TenantID, Key: fmt.Sprintf("%s-%06d", strings.Repeat("k", 100), i),
					Result: services.ResultDuplicate, Fingerprint: &fp, CorrelationID: &corr, Caller: "idg_test", AttemptedAt: now.Add(-time.Minute)})
			}
			require.NoError(t, db.CreateInBatches(batch, 500).Error)
			b := newDashBrowser(t, s)
			b.mustLogin(dashOperator(t, db, services.RoleAuditor, nil))
			var cookie []string
			for _, c := range b.cookies {
				cookie = append(cookie, c.Name+"="+c.Value)
			}
			fn(t, exportServer{s: s, base: base, cookie: strings.Join(cookie, "; "), secret: secret, poolSize: poolSize, rows: rows})
		})
	}
}

// smallBufferClient is an HTTP client whose sockets have a small receive buffer, so a client
// that reads slowly pushes back on the server at once rather than after megabytes.
func smallBufferClient() *http.Client {
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 16384) })
	}}
	return &http.Client{Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
}

// slowReader hands out at most chunk bytes per read and pauses between reads: a client on a
// slow link that keeps reading.
type slowReader struct {
	r     io.Reader
	chunk int
	pause time.Duration
}

func (s *slowReader) Read(p []byte) (int, error) {
	time.Sleep(s.pause)
	if len(p) > s.chunk {
		p = p[:s.chunk]
	}
	return s.r.Read(p)
}

// TestSlowCSVDownloadOutlastsWriteTimeout: an export that takes several write timeouts to
// read, by a client that keeps reading, arrives whole. The write timeout used to bound the
// whole streamed response, so a large range was cut off (status 200 long sent) and the rows
// past the cut, "possible duplicate effect" ones included, were missing from the file.
func TestSlowCSVDownloadOutlastsWriteTimeout(t *testing.T) {
	eachExportDialect(t, 5000, func(c *Config) { c.WriteTimeout = time.Second }, func(t *testing.T, e exportServer) {
		req, err := http.NewRequest(http.MethodGet, e.base+"/audit.csv", nil)
		require.NoError(t, err)
		req.Header.Set("Cookie", e.cookie)
		start := time.Now()
		resp, err := smallBufferClient().Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		// ~2.5 MB at a few hundred KB/s: the download lasts several write timeouts, no pause near one.
		cr := csv.NewReader(&slowReader{r: resp.Body, chunk: 16384, pause: 10 * time.Millisecond})
		var recs [][]string
		for {
			rec, err := cr.Read()
			if err == io.EOF {
				break
			}
			require.NoError(t, err, "after %d rows and %v (write timeout 1s)", len(recs), time.Since(start))
			recs = append(recs, rec)
		}
		took := time.Since(start)
		require.Len(t, recs, e.rows+1, "every row and the header")
		require.Equal(t, "possible_duplicate_effect", recs[0][len(recs[0])-1])
		require.True(t, strings.HasSuffix(recs[len(recs)-1][1], fmt.Sprintf("-%06d", e.rows-1)), "the last row is the last attempt")
		t.Logf("%d rows in %v with a 1s write timeout", len(recs)-1, took)
	})
}

// TestConcurrentCSVExportsAreCapped: exports beyond the per-instance cap (a quarter of the
// database pool, at least one) are refused at once with 429 and Retry-After on the
// dashboard's error page instead of queueing on the pool, and acquires made meanwhile are
// admitted. Six concurrent exports on a pool of two used to make acquires wait for
// connections (0.6–1.7 s, some answered 503).
func TestConcurrentCSVExportsAreCapped(t *testing.T) {
	eachExportDialect(t, 20000, func(*Config) {}, func(t *testing.T, e exportServer) {
		limit := max(1, e.poolSize/4)
		for i := 0; i < limit; i++ {
			stalledDownload(t, e.base, "/audit.csv", e.cookie)
		}
		client := &http.Client{Timeout: 30 * time.Second}
		for i := 0; i < 3; i++ {
			req, err := http.NewRequest(http.MethodGet, e.base+"/audit.csv", nil)
			require.NoError(t, err)
			req.Header.Set("Cookie", e.cookie)
			resp, err := client.Do(req)
			require.NoError(t, err)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "export %d beyond the cap of %d (pool %d): %.200s", i, limit, e.poolSize, body)
			require.NotEmpty(t, resp.Header.Get("Retry-After"))
			require.Contains(t, resp.Header.Get("Content-Type"), "text/html")
			require.Contains(t, string(body), "exports")
		}
		for i := 0; i < 5; i++ {
			req, _ := http.NewRequest(http.MethodPost, e.base+"/v1/acquire",
				strings.NewReader(fmt.Sprintf(`{"key":"during-capped-exports-%d","ttl_seconds":60}`, i)))
			req.Header.Set("Authorization", "Bearer "+e.secret)
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			require.NoError(t, err)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.Equal(t, http.StatusCreated, resp.StatusCode, "acquire %d: %s", i, body)
		}
	})
}
