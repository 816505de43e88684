package history

// Crash-safe compaction (issue 30 item 4, docs/reference.md §2 "Lifecycle"): reapers killed
// with SIGKILL at random points while they turn expired successes into tombstones, and
// callers retrying every key meanwhile. Each purge batch writes its tombstones and deletes
// its operations in one transaction, so at every instant a key is answered either by its
// operation (with its stored response) or by its tombstone, never admitted again within its
// horizon, and never answered with another or a missing response.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/testkit"
	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/models/modeltest"
	"github.com/stretchr/testify/require"
)

// tombstoneKeys is TOMBSTONE_N (the report: 100000), default 3,000: enough for purge
// batches of 1,000 to be cut by the kills, small enough for make test.
func tombstoneKeys(t *testing.T) int {
	if s := os.Getenv("TOMBSTONE_N"); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(t, err, "TOMBSTONE_N")
		return n
	}
	return 3000
}

func TestTombstonesSurviveKilledReapers(t *testing.T) {
	n := tombstoneKeys(t)
	dbURL, drop, err := modeltest.CreatePostgres()
	require.NoError(t, err)
	t.Cleanup(drop)
	// Only the killed reapers purge: the server's own reaper waits an hour between passes.
	url := startServer(t, "DATABASE_URL="+dbURL, "IDEMGATE_REAP_INTERVAL=1h")
	command := func(args ...string) *exec.Cmd {
		cmd := exec.Command(binary, args...)
		cmd.Env = append(testkit.MinimalEnv(), "DATABASE_URL="+dbURL)
		return cmd
	}
	out, err := command("policy", "set", "--tenant", "default", "--operation", "charge", "--retention", "1s",
		"--horizon", "1h").CombinedOutput()
	require.NoError(t, err, "%s", out)

	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	call := func(method, path string, body any) (int, map[string]any, error) {
		b, _ := json.Marshal(body)
		req, _ := http.NewRequest(method, url+path, bytes.NewReader(b))
		req.Header.Set("Authorization", "Bearer "+testAPIKey)
		req.Header.Set("Content-Type", "application/json")
		res, err := hc.Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer res.Body.Close()
		var m map[string]any
		_ = json.NewDecoder(res.Body).Decode(&m)
		return res.StatusCode, m, nil
	}
	key := func(i int) string { return fmt.Sprintf("tomb-%06d", i) }
	request := func(i int, fp string) map[string]any {
		return map[string]any{"key": key(i), "ttl_seconds": 1, "operation": "charge", "fingerprint": fp}
	}

	// Seed n successes, each with a receipt and a stored response naming its key.
	begin := time.Now()
	ids, owners := make([]string, n), make([]string, n)
	for from := 0; from < n; from += 500 {
		items := []any{}
		for i := from; i < min(from+500, n); i++ {
			items = append(items, request(i, "fp"))
		}
		status, body, err := call("POST", "/v1/acquire:batch", map[string]any{"items": items})
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, status, "%v", body)
		for j, r := range body["results"].([]any) {
			adm := r.(map[string]any)["body"].(map[string]any)
			ids[from+j] = adm["operation_id"].(string)
			owners[from+j] = adm["owner_token"].(string)
		}
	}
	var wg sync.WaitGroup
	next := atomic.Int64{}
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				status, body, err := call("POST", "/v1/operations/"+ids[i]+"/outcome", map[string]any{
					"owner_token": owners[i], "status": "succeeded", "receipt": "r-" + key(i), "response": map[string]any{"key": key(i)}})
				if err != nil || status != http.StatusOK {
					t.Errorf("outcome %d: %d %v %v", i, status, body, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	require.False(t, t.Failed())
	t.Logf("seeded %d successes in %s", n, time.Since(begin).Round(time.Millisecond))
	// Let the TTL (1 s) and the retention (1 s) pass without waiting: the tenant's deadlines
	// (holds, leases, purge times, horizons) move 3 s sooner (modeltest.Elapse).
	_, cdb := openCheckDB(t, dbURL)
	var tenantID int64
	require.NoError(t, cdb.Raw("SELECT id FROM tenants WHERE name = 'default'").Row().Scan(&tenantID))
	modeltest.Elapse(t, cdb, tenantID, 3*time.Second)

	// Callers retry every key until the reapers are done: the same request must always be a
	// duplicate of its operation, answered with its response or as its tombstone; another
	// fingerprint must always be refused.
	var violations, duplicates, tombstones, conflicts atomic.Int64
	ctx, stop := context.WithCancel(context.Background())
	var callers sync.WaitGroup
	for c := range 8 {
		callers.Add(1)
		go func() {
			defer callers.Done()
			rng := rand.New(rand.NewPCG(uint64(c), 7))
			for ctx.Err() == nil {
				i := rng.IntN(n)
				if rng.IntN(10) == 0 {
					status, body, err := call("POST", "/v1/acquire", request(i, "another"))
					if err == nil && status != http.StatusUnprocessableEntity {
						violations.Add(1)
						t.Errorf("key %s, another fingerprint: %d %v", key(i), status, body)
					}
					conflicts.Add(1)
					continue
				}
				status, body, err := call("POST", "/v1/acquire", request(i, "fp"))
				if err != nil {
					continue // no answer: nothing to judge
				}
				if msg := judgeDuplicate(status, body, ids[i], key(i)); msg != "" {
					violations.Add(1)
					t.Errorf("key %s: %s", key(i), msg)
					continue
				}
				if body["operation"].(map[string]any)["evidence_purged"] == true {
					tombstones.Add(1)
				} else {
					duplicates.Add(1)
				}
			}
		}()
	}

	db := cdb
	remaining := func() (left int64) {
		require.NoError(t, db.Model(&models.Operation{}).Count(&left).Error)
		return left
	}
	var kills, passes int
	rng := rand.New(rand.NewPCG(1, 2))
	deadline := time.Now().Add(10 * time.Minute)
	for remaining() > 0 {
		require.True(t, time.Now().Before(deadline), "the reapers did not purge everything in 10 minutes")
		reaper := command("reap")
		require.NoError(t, reaper.Start())
		done := make(chan error, 1)
		go func() { done <- reaper.Wait() }()
		select {
		case err := <-done:
			require.NoError(t, err, "a reaper pass that was not killed failed")
			passes++
		case <-time.After(time.Duration(50+rng.IntN(600)) * time.Millisecond):
			require.NoError(t, reaper.Process.Signal(syscall.SIGKILL))
			<-done
			kills++
		}
	}
	stop()
	callers.Wait()
	t.Logf("%d keys purged by %d reaper passes killed and %d finished; callers saw %d duplicates with evidence, "+
		"%d tombstone answers, %d conflicts refused, %d violations", n, kills, passes, duplicates.Load(),
		tombstones.Load(), conflicts.Load(), violations.Load())
	require.Zero(t, violations.Load())
	require.NotZero(t, kills, "no reaper was killed: the test proved nothing about crashes")

	// Every key kept its tombstone, and answers from it.
	var tombs int64
	require.NoError(t, db.Model(&models.IdemKey{}).Where("tomb_state = 'succeeded' AND protected_until > now()").Count(&tombs).Error)
	require.EqualValues(t, n, tombs, "keys with a tombstone")
	for _, i := range []int{0, n / 2, n - 1} {
		status, body, err := call("POST", "/v1/acquire", request(i, "fp"))
		require.NoError(t, err)
		require.Empty(t, judgeDuplicate(status, body, ids[i], key(i)))
		require.Equal(t, true, body["operation"].(map[string]any)["evidence_purged"])
	}
}

// judgeDuplicate says what is wrong with an acquire answer that must be a duplicate of
// operation id of key: "" when it is one, answered with its stored response or as its
// tombstone (then with its receipt and no response).
func judgeDuplicate(status int, body map[string]any, id, key string) string {
	if status != http.StatusOK || body["admitted"] != false {
		return fmt.Sprintf("admitted again or refused within the horizon: %d %v", status, body)
	}
	op, _ := body["operation"].(map[string]any)
	if op == nil || op["id"] != id || op["state"] != "succeeded" || op["fencing_token"] != float64(1) {
		return fmt.Sprintf("another operation: %v", op)
	}
	out, _ := op["outcome"].(map[string]any)
	if out == nil || out["receipt"] != "r-"+key {
		return fmt.Sprintf("another or no outcome: %v", op)
	}
	if op["evidence_purged"] == true {
		if out["response"] != nil {
			return fmt.Sprintf("a tombstone with a response: %v", op)
		}
		return ""
	}
	resp, _ := out["response"].(map[string]any)
	if resp == nil || resp["key"] != key {
		return fmt.Sprintf("a stale or missing response with the evidence kept: %v", op)
	}
	return ""
}
