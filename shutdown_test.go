package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemgate/idemgate/models"
	"github.com/stretchr/testify/require"
)

// TestGracefulShutdownCommitsEveryAnswer (issue 4 point 3): SIGTERM during a stream of
// concurrent acquires. The server stops accepting, finishes what is in flight and exits 0
// within IDEMGATE_SHUTDOWN_TIMEOUT; every acquire it answered 201 is committed (same operation
// id, fencing token 1). Requests that got no answer are allowed; a 201 without a row is not.
func TestGracefulShutdownCommitsEveryAnswer(t *testing.T) {
	const shutdownTimeout = 5 * time.Second
	dbPath := filepath.Join(t.TempDir(), "shutdown.db")
	s := startServer(t, "IDEMGATE_SQLITE_PATH="+dbPath, "IDEMGATE_SHUTDOWN_TIMEOUT="+shutdownTimeout.String())
	addr := strings.TrimPrefix(s.url, "http://")

	type answer struct {
		key    string
		status int
		body   map[string]any
		at     time.Time
	}
	const workers = 50
	var (
		mu      sync.Mutex
		answers []answer
		wg      sync.WaitGroup
	)
	started := make(chan struct{}, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			// Every worker signals once, also one that stops before its second request, so the
			// wait below cannot hang on a worker that has gone.
			var once sync.Once
			signal := func() { once.Do(func() { started <- struct{}{} }) }
			defer signal()
			for n := 0; ; n++ {
				if n == 1 {
					signal()
				}
				key := fmt.Sprintf("shutdown-%d-%d", w, n)
				st, body := post(t, s.url+"/v1/acquire", map[string]any{"key": key, "ttl_seconds": 300})
				mu.Lock()
				answers = append(answers, answer{key: key, status: st, body: body, at: time.Now()})
				mu.Unlock()
				if st != http.StatusCreated {
					return // connection refused or closed: the server is going away
				}
			}
		}(w)
	}
	// Every worker has an answer and another acquire on its way.
	for i := 0; i < workers; i++ {
		select {
		case <-started:
		case <-time.After(2 * time.Minute):
			t.Fatalf("only %d of %d workers got an answer within 2 minutes", i, workers)
		}
	}
	time.Sleep(50 * time.Millisecond)

	exited := make(chan error, 1)
	sigterm := time.Now()
	require.NoError(t, s.Signal(syscall.SIGTERM))
	go func() { exited <- s.Wait() }()

	// New connections are refused once shutdown has begun (bounded poll).
	refusedAt := time.Time{}
	for deadline := time.Now().Add(shutdownTimeout); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			refusedAt = time.Now()
			break
		}
		c.Close()
	}
	require.False(t, refusedAt.IsZero(), "the server still accepted connections %s after SIGTERM", shutdownTimeout)

	var waitErr error
	select {
	case waitErr = <-exited:
	case <-time.After(shutdownTimeout + 3*time.Second):
		t.Fatalf("the server did not exit within the shutdown timeout (%s)", shutdownTimeout)
	}
	exitedAt := time.Now()
	require.NoError(t, waitErr, "the server must exit with status 0 after SIGTERM")
	var exitErr *exec.ExitError
	require.False(t, errors.As(waitErr, &exitErr))
	wg.Wait()
	t.Logf("refused new connections %s after SIGTERM, exited after %s", refusedAt.Sub(sigterm), exitedAt.Sub(sigterm))

	db, err := models.Open(context.Background(), models.OpenOptions{SQLitePath: dbPath})
	require.NoError(t, err)
	defer db.Close()
	admitted, afterSignal, unanswered := 0, 0, 0
	for _, a := range answers {
		switch a.status {
		case http.StatusCreated:
			admitted++
			if a.at.After(sigterm) {
				afterSignal++
			}
			id, _ := a.body["operation_id"].(string)
			require.NotEmpty(t, id, "%s: %v", a.key, a.body)
			var op models.Operation
			require.NoError(t, db.Where("id = ?", id).Take(&op).Error,
				"%s was answered 201 (operation %s) but nothing was committed", a.key, id)
			require.Equal(t, a.key, op.Key)
			require.EqualValues(t, 1, op.FencingToken)
			require.EqualValues(t, 1, a.body["fencing_token"])
		case 0:
			unanswered++
		default:
			// A draining server may answer a request on a closing connection with an error
			// status; it must not be a success, and the key must have no operation.
			require.NotEqual(t, http.StatusOK, a.status, "%s: %v", a.key, a.body)
			var n int64
			require.NoError(t, db.Model(&models.Operation{}).Where(&models.Operation{Key: a.key}).Count(&n).Error)
			require.Zero(t, n, "%s was refused with %d but has an operation", a.key, a.status)
		}
	}
	t.Logf("%d acquires: %d admitted (%d answered after SIGTERM), %d without an answer",
		len(answers), admitted, afterSignal, unanswered)
	require.Greater(t, admitted, workers, "the load ran before the signal")
	require.Positive(t, afterSignal, "requests in flight at SIGTERM were finished and answered")
	var total int64
	require.NoError(t, db.Model(&models.Operation{}).Count(&total).Error)
	// Unanswered requests may or may not have been committed; answered ones all were.
	require.GreaterOrEqual(t, int(total), admitted)
	require.LessOrEqual(t, int(total), admitted+unanswered)
}
