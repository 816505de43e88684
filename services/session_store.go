package services

import (
	"context"
	"errors"
	"time"

	"github.com/idemgate/idemgate/models"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// DefaultSessionStoreTimeout is the deadline of each SessionStore call unless WithTimeout sets
// another: the HTTP layer's default store deadline, so a stalled database cannot hold a
// dashboard request on its session longer than on its other database work.
const DefaultSessionStoreTimeout = 5 * time.Second

// SessionStore keeps dashboard sessions in the sessions table, so they survive restarts and
// are shared by every instance on one database (docs/reference.md §5). Its method set is fiber's
// session storage (fiber.Storage): Get, Set, Delete, Reset and Close, over string keys and
// opaque []byte values; the HTTP layer hands it to fiber's session middleware. Expired rows
// are ignored on read and deleted by the reaper. Writes go through models.DB.Write, so on
// SQLite they queue for the write lock with every acquire instead of polling for it
// (TestSessionStoreWritesDuringSQLiteStorm). Safe for concurrent use.
type SessionStore struct {
	db      *models.DB
	timeout time.Duration
}

// NewSessionStore returns a SessionStore over db. Each call is bounded by
// DefaultSessionStoreTimeout; see WithTimeout.
func NewSessionStore(db *models.DB) *SessionStore {
	return &SessionStore{db: db, timeout: DefaultSessionStoreTimeout}
}

// WithTimeout sets the deadline of each call (the server's store timeout: fiber.Storage passes
// no request context, so the request's own deadline cannot reach it) and returns s. d <= 0
// keeps the current deadline.
func (s *SessionStore) WithTimeout(d time.Duration) *SessionStore {
	if d > 0 {
		s.timeout = d
	}
	return s
}

func (s *SessionStore) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), s.timeout)
}

// Get returns the session data of key, or nil when there is none or it expired. Errors are
// the database's, unwrapped.
func (s *SessionStore) Get(key string) ([]byte, error) {
	ctx, cancel := s.ctx()
	defer cancel()
	var row models.Session
	err := s.db.WithContext(ctx).Where("id = ?", key).Take(&row).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	if row.ExpiresAt != nil && !row.ExpiresAt.After(time.Now()) {
		return nil, nil
	}
	return row.Data, nil
}

// Set stores val under key for exp (0: no expiry), replacing any earlier value.
func (s *SessionStore) Set(key string, val []byte, exp time.Duration) error {
	ctx, cancel := s.ctx()
	defer cancel()
	row := models.Session{ID: key, Data: val}
	if exp > 0 {
		t := time.Now().UTC().Add(exp)
		row.ExpiresAt = &t
	}
	return s.db.Write(ctx, func(db *gorm.DB) error {
		return db.Clauses(clause.OnConflict{
			Columns:   []clause.Column{{Name: "id"}},
			DoUpdates: clause.AssignmentColumns([]string{"data", "expires_at"}),
		}).Create(&row).Error
	})
}

// Delete removes key; a missing key is not an error.
func (s *SessionStore) Delete(key string) error {
	ctx, cancel := s.ctx()
	defer cancel()
	return s.db.Write(ctx, func(db *gorm.DB) error { return db.Where("id = ?", key).Delete(&models.Session{}).Error })
}

// Reset removes every session: every dashboard account is signed out.
func (s *SessionStore) Reset() error {
	ctx, cancel := s.ctx()
	defer cancel()
	return s.db.Write(ctx, func(db *gorm.DB) error { return db.Where("1 = 1").Delete(&models.Session{}).Error })
}

// Close does nothing: the database belongs to the caller.
func (s *SessionStore) Close() error { return nil }
