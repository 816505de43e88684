package web

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

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
	// ~16 MB of CSV: many times what the socket buffers between server and client hold. The cap
	// on exports is raised above the downloads: what is tested here is that a running export
	// holds no connection while it writes, however many run.
	eachExportDialect(t, 30000, func(cfg *Config) { cfg.MaxConcurrentExports = 100 }, func(t *testing.T, e exportServer) {
		for i := 0; i < e.poolSize+2; i++ {
			stalledDownload(t, e.base, "/audit.csv", e.cookie)
		}
		time.Sleep(500 * time.Millisecond) // let every export run into its full socket

		client := &http.Client{Timeout: 30 * time.Second}
		var took []time.Duration
		for i := 0; i < 10; i++ {
			req, _ := http.NewRequest(http.MethodPost, e.base+"/v1/acquire",
				strings.NewReader(fmt.Sprintf(`{"key":"during-exports-%d","ttl_seconds":60}`, i)))
			req.Header.Set("Authorization", "Bearer "+e.secret)
			req.Header.Set("Content-Type", "application/json")
			start := time.Now()
			resp, err := client.Do(req)
			require.NoError(t, err)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			took = append(took, time.Since(start))
			require.Equal(t, http.StatusCreated, resp.StatusCode, "acquire %d with %d stalled downloads on a pool of %d: %s",
				i, e.poolSize+2, e.poolSize, body)
		}
		sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
		t.Logf("%d stalled downloads, pool %d: acquire latency median %v max %v", e.poolSize+2, e.poolSize,
			took[len(took)/2], took[len(took)-1])
	})
}
