package playback

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/services"
)

// SandboxTenant is the name of the playback's tenant in the sandbox store, shown on the page
// so nobody takes its keys for a real tenant's.
const SandboxTenant = "sandbox"

// sandboxRetention is how long the sandbox keeps an ended operation's evidence before its
// reaper purges it: a playback is read for minutes, and the file must not grow with every
// playback a long-running server ever played.
const sandboxRetention = time.Hour

// sandboxReapEvery is how often the sandbox's own reaper runs (expiring holds nobody
// reconciled and purging after sandboxRetention).
const sandboxReapEvery = time.Minute

// sandbox is a private idemgate store: an SQLite file of its own in a temporary directory,
// migrated like any store and served by services.New, with one tenant (SandboxTenant) and
// one API key. It is never the deployment's database, so nothing played in it reaches
// another tenant's counts, webhooks, audit or metrics, and moving its clock
// (models.DB.Elapse) moves nobody else's.
type sandbox struct {
	dir       string
	db        *models.DB
	svc       *services.Services
	principal services.Principal
	stop      context.CancelFunc
	reaped    chan struct{}
}

// openSandbox creates the sandbox store under the system's temporary directory. Errors: the
// file system's or the migration's; nothing is left behind on error.
func openSandbox(ctx context.Context, log *slog.Logger) (_ *sandbox, err error) {
	dir, err := os.MkdirTemp("", "idemgate-playback-*")
	if err != nil {
		return nil, fmt.Errorf("playback sandbox: %w", err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
		}
	}()
	db, err := models.Open(ctx, models.OpenOptions{SQLitePath: filepath.Join(dir, "sandbox.db"), StoreTimeout: 5 * time.Second})
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
	secret, err := svc.Accounts.CreateAPIKey(ctx, services.Installation(), SandboxTenant, "playback", "")
	if err != nil {
		return nil, fmt.Errorf("playback sandbox: %w", err)
	}
	p, err := svc.Auth.Authenticate(ctx, secret)
	if err != nil {
		return nil, fmt.Errorf("playback sandbox: %w", err)
	}
	rctx, stop := context.WithCancel(context.Background())
	sb := &sandbox{dir: dir, db: db, svc: svc, principal: p, stop: stop, reaped: make(chan struct{})}
	go func() {
		defer close(sb.reaped)
		svc.Reaper.Run(rctx, sandboxReapEvery)
	}()
	return sb, nil
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

// lazySandbox opens the sandbox at first use, so a server whose operators never open the
// playback creates no file. A failed open is retried on the next use.
type lazySandbox struct {
	log    *slog.Logger
	mu     sync.Mutex
	sb     *sandbox
	closed bool
}

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
	return l.sb, nil
}

func (l *lazySandbox) close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	if l.sb == nil {
		return nil
	}
	err := l.sb.close()
	l.sb = nil
	return err
}
