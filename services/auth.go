package services

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/idemgate/idemgate/models"
	"golang.org/x/crypto/bcrypt"
	"gorm.io/gorm"
)

// Auth authenticates: API keys on every API request (Authenticate, the hot path, with its
// cache), operators at sign-in (Login) and on every dashboard request (Operator). Creating and
// revoking keys and accounts is Accounts'; a revocation made through an Accounts wired to this
// Auth (NewAccounts) takes effect here at once (forget).
//
// API-key lookups are cached in process memory for at most CacheTTL (1 s), so a revoked key
// stops working on every instance within that bound (issue 2) without a database read per
// request. An answer is used only while less than CacheTTL has passed since the lookup that
// produced it began, however it was obtained (cache, refresh, or a lookup shared with
// concurrent requests), which is what keeps that bound.
//
// Under load the cache is kept warm rather than left to lapse: a key used after half its
// entry's life is looked up again in the background (one lookup per key at a time) while
// requests go on using the entry, which is still within its bound. Requests that find no
// usable entry share one lookup per key (keyFlight) instead of each asking the database.
// Before this, every second each in-flight request of a busy key missed at once, and each
// sent its own query (and, once a minute, its own last_used_at update of the same row,
// serialized on its row lock while holding pool connections): a burst that showed as the
// acquire's tail latency.
type Auth struct {
	db  *models.DB
	log *slog.Logger

	mu      sync.Mutex
	cache   map[string]cachedKey  // by secret hash
	flights map[string]*keyFlight // lookups in progress, by secret hash
	// touched is when this process last wrote last_used_at of a key, by secret hash.
	touched map[string]time.Time
	// gen counts revocations this Auth was told of (forget): a lookup begun before one stores no
	// answer, so a revoked key cannot come back into the cache from a read older than it.
	gen uint64

	// now is the clock of the cache's ages (tests move it instead of sleeping).
	now func() time.Time
}

type cachedKey struct {
	p Principal
	// fetched is when the lookup that produced p began: p reflects every revocation
	// committed before then.
	fetched time.Time
	// refreshing is set while a background lookup of this entry runs, and stays set when one
	// fails, so a failing database gets one attempt per entry, not one per request.
	refreshing bool
}

// keyFlight is one database lookup of an API key that concurrent requests for the same key
// wait for instead of each making their own. done is closed once p and err are set.
type keyFlight struct {
	started time.Time
	done    chan struct{}
	p       Principal
	err     error
}

// CacheTTL is the longest a positive API-key lookup is reused without asking the database.
const CacheTTL = time.Second

// refreshAfter is the age at which a cached key in use is looked up again in the background:
// early enough that the new answer is in before the entry lapses, under any database latency
// short of half the TTL.
const refreshAfter = CacheTTL / 2

// refreshTimeout bounds a background lookup, which no request's deadline bounds.
const refreshTimeout = 5 * time.Second

// maxCachedKeys bounds the cache; it is simply emptied when full (keys are few in practice).
const maxCachedKeys = 10000

// lastUsedEvery throttles writes of api_keys.last_used_at to one per key per process.
const lastUsedEvery = time.Minute

// NewAuth returns an Auth over db; log may be nil (nothing is logged).
func NewAuth(db *models.DB, log *slog.Logger) *Auth {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Auth{db: db, log: log, cache: map[string]cachedKey{},
		flights: map[string]*keyFlight{}, touched: map[string]time.Time{}, now: time.Now}
}

// Authenticate returns the principal of an unrevoked API key. Errors: ErrUnauthorized for an
// unknown or revoked key, ErrStoreUnavailable.
func (a *Auth) Authenticate(ctx context.Context, secret string) (Principal, error) {
	if secret == "" || len(secret) > 256 {
		return Principal{}, ErrUnauthorized
	}
	h := hashSecret(secret)
	for {
		now := a.now()
		a.mu.Lock()
		if c, ok := a.cache[h]; ok && now.Sub(c.fetched) < CacheTTL {
			if now.Sub(c.fetched) >= refreshAfter && !c.refreshing {
				c.refreshing = true
				a.cache[h] = c
				go a.refresh(h, a.gen)
			}
			a.mu.Unlock()
			return c.p, nil
		}
		if f := a.flights[h]; f != nil {
			a.mu.Unlock()
			select {
			case <-f.done:
			case <-ctx.Done():
				return Principal{}, storeError("authenticate", ctx.Err())
			}
			// The shared answer is as fresh as its lookup's start, and is used only within
			// CacheTTL of it. A lookup that failed on its own request's deadline or
			// cancellation says nothing about this request: look again.
			if a.now().Sub(f.started) < CacheTTL && !isContextError(f.err) {
				return f.p, f.err
			}
			continue
		}
		f := &keyFlight{started: now, done: make(chan struct{})}
		a.flights[h] = f
		gen := a.gen
		a.mu.Unlock()
		return a.lead(ctx, f, h, gen)
	}
}

// lead makes the lookup of flight f for the key with secret hash h and hands its answer to
// the requests waiting on f.
func (a *Auth) lead(ctx context.Context, f *keyFlight, h string, gen uint64) (Principal, error) {
	f.err = errFlightAbandoned // replaced below unless lookup panics
	defer func() {
		a.mu.Lock()
		delete(a.flights, h)
		a.mu.Unlock()
		close(f.done)
	}()
	f.p, f.err = a.lookup(ctx, h, f.started, gen)
	return f.p, f.err
}

// errFlightAbandoned is what waiting requests see of a lookup that never finished (it
// panicked); it is a context error, so they make their own.
var errFlightAbandoned = fmt.Errorf("API key lookup abandoned: %w", context.Canceled)

// isContextError reports whether err comes from a context's end rather than the database.
func isContextError(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// forget drops the API keys with secret hashes hs from the cache, after they were revoked: this
// process refuses them at once, and a lookup still in flight, which read them before the
// revocation, does not cache them again (gen).
func (a *Auth) forget(hs ...string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, h := range hs {
		delete(a.cache, h)
	}
	a.gen++
}

// refresh looks the key with secret hash h up again in the background (Authenticate starts it
// for an entry past refreshAfter). It is no request's work, so it logs without a request id.
// A failure leaves the entry to lapse at its own time, after which requests look the key up
// themselves and see the error.
func (a *Auth) refresh(h string, gen uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), refreshTimeout)
	defer cancel()
	if _, err := a.lookup(ctx, h, a.now(), gen); err != nil && !errors.Is(err, ErrUnauthorized) {
		a.log.DebugContext(ctx, "could not refresh a cached API key", "err", err)
	}
}

// lookup reads the API key with secret hash h from the database and caches the answer as
// fetched at started (when the lookup began), unless this Auth was told of a revocation
// (forget) since gen was read. A key not found (or revoked) is dropped from the cache. It
// records the key's use (last_used_at) at most every lastUsedEvery per process, in the
// background.
// Errors: ErrUnauthorized, ErrStoreUnavailable.
func (a *Auth) lookup(ctx context.Context, h string, started time.Time, gen uint64) (Principal, error) {
	var k struct {
		models.APIKey
		TenantName string
	}
	// The tenant's name rides along for metrics labels (tenants are never renamed).
	err := a.db.WithContext(ctx).Model(&models.APIKey{}).
		Select("api_keys.id, api_keys.tenant_id, api_keys.prefix, tenants.name AS tenant_name").
		Joins("JOIN tenants ON tenants.id = api_keys.tenant_id").
		Where("api_keys.secret_hash = ? AND api_keys.revoked_at IS NULL", h).Take(&k).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		a.mu.Lock()
		delete(a.cache, h)
		a.mu.Unlock()
		return Principal{}, ErrUnauthorized
	} else if err != nil {
		return Principal{}, storeError("authenticate", err)
	}
	p := Principal{TenantID: k.TenantID, TenantName: k.TenantName, APIKeyID: k.ID, Prefix: k.Prefix}
	a.mu.Lock()
	if gen == a.gen {
		if len(a.cache) >= maxCachedKeys {
			a.cache = map[string]cachedKey{}
			a.touched = map[string]time.Time{}
		}
		if c, ok := a.cache[h]; !ok || !c.fetched.After(started) {
			a.cache[h] = cachedKey{p: p, fetched: started}
		}
	}
	// Decided under the lock, so concurrent lookups of one key write last_used_at once.
	now := a.now()
	touch := now.Sub(a.touched[h]) >= lastUsedEvery
	if touch {
		a.touched[h] = now
	}
	a.mu.Unlock()
	if touch {
		// Bookkeeping only: it must not slow or fail the request it rides on.
		// The request's context values (its request id, for the log) without its cancellation.
		go func(ctx context.Context, id int64) {
			ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			if err := a.db.Write(ctx, func(db *gorm.DB) error {
				return db.Model(&models.APIKey{}).Where("id = ?", id).Update("last_used_at", time.Now().UTC()).Error
			}); err != nil {
				a.log.DebugContext(ctx, "could not record API key use", "err", err)
			}
		}(context.WithoutCancel(ctx), k.ID)
	}
	return p, nil
}

// OperatorAccount is an operator as the dashboard sees it. TenantID nil means global.
type OperatorAccount struct {
	ID       int64
	Username string
	Role     string
	TenantID *int64
}

// dummyHash is compared against when the username is unknown, so a login takes as long for
// an unknown user as for a wrong password. It is made on first use, not at package init:
// generating it costs one bcrypt (tens of milliseconds), which every start of the binary and
// of every test binary importing services paid even when nobody logs in. Only the first
// unknown-user login of a process pays that generation on top of its compare.
var dummyHash = sync.OnceValue(func() []byte {
	h, _ := bcrypt.GenerateFromPassword([]byte("idemgate-timing-equaliser"), bcrypt.DefaultCost)
	return h
})

// WarmUp makes the one-time hash that equalises login timing now, so that even the first
// login for an unknown user takes as long as a wrong password. serve calls it in the
// background at start; it is safe to call any number of times.
func (a *Auth) WarmUp() { dummyHash() }

// Login checks an operator's username and password. Errors: ErrUnauthorized (unknown user or
// wrong password, indistinguishable), ErrStoreUnavailable.
func (a *Auth) Login(ctx context.Context, username, password string) (*OperatorAccount, error) {
	var op models.Operator
	err := a.db.WithContext(ctx).Where("username = ?", username).Take(&op).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		_ = bcrypt.CompareHashAndPassword(dummyHash(), []byte(password))
		return nil, ErrUnauthorized
	} else if err != nil {
		return nil, storeError("login", err)
	}
	if bcrypt.CompareHashAndPassword([]byte(op.PasswordHash), []byte(password)) != nil {
		return nil, ErrUnauthorized
	}
	return &OperatorAccount{ID: op.ID, Username: op.Username, Role: op.Role, TenantID: op.TenantID}, nil
}

// Operator returns the account with id. Errors: ErrNotFound, ErrStoreUnavailable.
func (a *Auth) Operator(ctx context.Context, id int64) (*OperatorAccount, error) {
	var op models.Operator
	err := a.db.WithContext(ctx).Where("id = ?", id).Take(&op).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, ErrNotFound
	} else if err != nil {
		return nil, storeError("get operator", err)
	}
	return &OperatorAccount{ID: op.ID, Username: op.Username, Role: op.Role, TenantID: op.TenantID}, nil
}
