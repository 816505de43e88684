package playback

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/services"
)

// TenantPrefix starts the name of every playback's tenant in the sandbox ("sandbox-3f9a…"),
// shown on the page so nobody takes its keys for a real tenant's.
const TenantPrefix = "sandbox-"

// sandboxRetention is how long the sandbox keeps an ended operation's evidence before its
// reaper purges it: a playback is read for minutes.
const sandboxRetention = time.Hour

// sandboxReapEvery is how often the sandbox's own reaper runs (expiring holds and purging
// after sandboxRetention).
const sandboxReapEvery = time.Minute

// storeTimeout bounds each transaction in the sandbox (models.OpenOptions.StoreTimeout:
// SQLite's busy_timeout too), well under the dashboard request's own deadline (5 s by
// default): a locked sandbox answers store_unavailable in time for the request to render its
// 503 page, where a sandbox call otherwise takes milliseconds. SQLite's wait for a lock does
// not watch the request's context, so only this bound keeps it short. A variable so a test
// can meet the bound without waiting seconds.
var storeTimeout = 2 * time.Second

// maxTenantsPerSandbox bounds the playbacks one sandbox file takes before it is replaced by a
// fresh one. A playback left before step 8 leaves an uncertain operation, which no purge
// removes (it is not ended), so without a bound any signed-in account could grow the file
// without end (about 10 KB a playback). 2,000 playbacks is about 20 MB.
const maxTenantsPerSandbox = 2000

// dirPattern names sandbox directories in the system's temporary directory; pidFile in each
// holds the process id of the server that made it, so a later start can remove one that a
// killed server (kill -9) left behind.
const (
	dirPrefix = "idemgate-playback-"
	pidFile   = "pid"
)

// sandbox is a private idemgate store: an SQLite file of its own in a temporary directory,
// migrated like any store and served by services.New. It is never the deployment's database,
// so nothing played in it reaches a real tenant's counts, webhooks, audit or metrics, and
// moving its clock (models.DB.Elapse) moves nobody else's. Each playback gets a tenant of
// its own in it (newTenant), so one playback's lists never show another's operations.
type sandbox struct {
	dir    string
	db     *models.DB
	svc    *services.Services
	stop   context.CancelFunc
	reaped chan struct{}
	// users counts the Play calls using the sandbox; a retired sandbox is closed once it is 0.
	users sync.WaitGroup
	// tenants counts the tenants made (one a playback) against maxTenantsPerSandbox.
	tenants atomic.Int64
}

// openSandbox creates the sandbox store under the system's temporary directory, first
// removing the sandboxes of servers that are no longer running. Errors: the file system's or
// the migration's; nothing is left behind on error.
func openSandbox(ctx context.Context, log *slog.Logger) (_ *sandbox, err error) {
	removeStale(os.TempDir(), log)
	dir, err := os.MkdirTemp("", dirPrefix+"*")
	if err != nil {
		return nil, fmt.Errorf("playback sandbox: %w", err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
		}
	}()
	if err := os.WriteFile(filepath.Join(dir, pidFile), []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		return nil, fmt.Errorf("playback sandbox: %w", err)
	}
	db, err := models.Open(ctx, models.OpenOptions{SQLitePath: filepath.Join(dir, "sandbox.db"), StoreTimeout: storeTimeout})
	if err != nil {
		return nil, fmt.Errorf("playback sandbox: %w", err)
	}
	defer func() {
		if err != nil {
			_ = db.Close()
		}
	}()
	if _, err := models.Migrate(ctx, db, slog.New(slog.DiscardHandler)); err != nil {
		return nil, fmt.Errorf("playback sandbox: %w", err)
	}
	svc := services.New(db, log, services.Options{Retention: sandboxRetention})
	rctx, stop := context.WithCancel(context.Background())
	sb := &sandbox{dir: dir, db: db, svc: svc, stop: stop, reaped: make(chan struct{})}
	go func() {
		defer close(sb.reaped)
		svc.Reaper.Run(rctx, sandboxReapEvery)
	}()
	return sb, nil
}

// newTenant makes a tenant of its own for one playback, with an API key, through the same
// account services an administrator uses, and returns its principal.
func (sb *sandbox) newTenant(ctx context.Context) (services.Principal, error) {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	secret, err := sb.svc.Accounts.CreateAPIKey(ctx, services.Installation(), TenantPrefix+hex.EncodeToString(b), "playback", "")
	if err != nil {
		return services.Principal{}, err
	}
	sb.tenants.Add(1)
	return sb.svc.Auth.Authenticate(ctx, secret)
}

// close stops the sandbox's reaper, closes its store and removes its directory.
func (sb *sandbox) close() error {
	sb.stop()
	<-sb.reaped
	err := sb.db.Close()
	if rmErr := os.RemoveAll(sb.dir); err == nil {
		err = rmErr
	}
	return err
}

// removeStale removes the sandbox directories under tmp whose server process has ended: a
// server killed with SIGKILL never ran its shutdown. A directory without a readable pid (one
// being created right now) or of a process that still runs is left alone.
func removeStale(tmp string, log *slog.Logger) {
	dirs, err := filepath.Glob(filepath.Join(tmp, dirPrefix+"*"))
	if err != nil {
		return
	}
	for _, dir := range dirs {
		raw, err := os.ReadFile(filepath.Join(dir, pidFile))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if !processEnded(pid) {
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			log.Warn("remove a stale playback sandbox", "dir", dir, "err", err)
		}
	}
}

// processEnded reports whether no process pid runs any more (signal 0 answers "no such
// process"). A process of another user (EPERM) or a platform without signals counts as
// running, so nothing is removed on doubt.
func processEnded(pid int) bool {
	proc, err := os.FindProcess(pid)
	if err != nil {
		return false
	}
	err = proc.Signal(syscall.Signal(0))
	return errors.Is(err, os.ErrProcessDone) || errors.Is(err, syscall.ESRCH)
}

// lazySandbox opens the sandbox at first use, so a server whose operators never open the
// playback creates no file, and replaces it (retire) when it is full or has failed.
type lazySandbox struct {
	log      *slog.Logger
	mu       sync.Mutex
	sb       *sandbox
	closed   bool
	retiring sync.WaitGroup
}

// get returns the current sandbox, opening one if there is none, counted as used until
// release. Errors: ErrClosed, or openSandbox's (retried on the next get).
func (l *lazySandbox) get(ctx context.Context) (*sandbox, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, ErrClosed
	}
	if l.sb == nil {
		sb, err := openSandbox(ctx, l.log)
		if err != nil {
			return nil, err
		}
		l.sb = sb
	}
	l.sb.users.Add(1)
	return l.sb, nil
}

// release ends a use of sb begun by get; nil is no use.
func (l *lazySandbox) release(sb *sandbox) {
	if sb != nil {
		sb.users.Done()
	}
}

// retire replaces sb, if it is still the current sandbox, by a fresh one at the next get,
// and closes and removes sb once its last user has released it. The playbacks played in it
// start again on the new one.
func (l *lazySandbox) retire(sb *sandbox, why string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sb != sb {
		return
	}
	l.sb = nil
	l.log.Info("playback sandbox replaced", "why", why, "dir", sb.dir)
	l.retiring.Add(1)
	go func() {
		defer l.retiring.Done()
		sb.users.Wait()
		if err := sb.close(); err != nil {
			l.log.Warn("close a playback sandbox", "dir", sb.dir, "err", err)
		}
	}()
}

// close closes the current sandbox and waits for the retired ones to close.
func (l *lazySandbox) close() error {
	l.mu.Lock()
	l.closed = true
	sb := l.sb
	l.sb = nil
	l.mu.Unlock()
	var err error
	if sb != nil {
		sb.users.Wait()
		err = sb.close()
	}
	l.retiring.Wait()
	return err
}
