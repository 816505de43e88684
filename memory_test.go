package main

import (
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgate/idemgate/models/modeltest"
	"github.com/stretchr/testify/require"
)

// rssBytes reads the resident set size of process pid from /proc.
func rssBytes(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			require.NoError(t, err)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS in /proc status")
	return 0
}

// TestMemoryFlatOverManyKeys sends 100,000 acquires of distinct random keys with a 1 s TTL and
// checks the server keeps no per-key state in memory: resident memory after all of them (and
// reaper passes over the expired holds) is within a fixed allowance of what it was after the
// first 20,000. 80,000 more keys at even 200 bytes each would exceed the allowance.
func TestMemoryFlatOverManyKeys(t *testing.T) {
	url, drop, err := modeltest.CreatePostgres()
	require.NoError(t, err)
	t.Cleanup(drop)
	s := startServer(t, "DATABASE_URL="+url, "IDEMGATE_REAP_INTERVAL=1s", "IDEMGATE_RETENTION=1s")

	const total, warm, workers = 100_000, 20_000, 32
	const allowance = 16 << 20 // bytes
	var next, failures atomic.Int64
	run := func(upto int64) {
		var wg sync.WaitGroup
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					n := next.Add(1)
					if n > upto {
						return
					}
					st, _ := post(t, s.url+"/v1/acquire", map[string]any{"key": fmt.Sprintf("mem-%d-%x", n, n*2654435761), "ttl_seconds": 1})
					if st != http.StatusCreated {
						failures.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		next.Store(upto)
	}
	run(warm)
	pid := s.Pid()
	base := rssBytes(t, pid)
	run(total)
	time.Sleep(3 * time.Second) // let the reaper expire the last holds (interval 1 s, TTL 1 s)
	after := rssBytes(t, pid)
	require.Zero(t, failures.Load(), "every acquire was admitted")
	t.Logf("RSS after %d keys: %d KiB; after %d keys and reaper passes: %d KiB", warm, base>>10, total, after>>10)
	require.Less(t, after-base, int64(allowance), "resident memory grew with the number of keys")
}
