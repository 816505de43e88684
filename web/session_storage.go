package web

import (
	"context"
	"errors"
	"time"

	"github.com/idemgate/idemgate/models"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// sessionStorage is a fiber.Storage over the sessions table, so dashboard sessions survive
// restarts and are shared by every instance on one database (SPEC.md §5).
type sessionStorage struct {
	db      *models.DB
	timeout time.Duration
}

// NewSessionStorage returns a fiber.Storage that keeps sessions in db. Expired rows are ignored
// on read and deleted by the reaper. Each call is bounded by DefaultStoreTimeout; see
// WithTimeout.
func NewSessionStorage(db *models.DB) *sessionStorage {
	return &sessionStorage{db: db, timeout: DefaultStoreTimeout}
}

// WithTimeout sets the deadline of each call (Config.StoreTimeout: fiber.Storage passes no
// request context, so the request's own deadline cannot reach it) and returns s.
func (s *sessionStorage) WithTimeout(d time.Duration) *sessionStorage {
	if d > 0 {
		s.timeout = d
	}
	return s
}

func (s *sessionStorage) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), s.timeout)
}

// Get returns the session data, or nil when there is none or it expired.
func (s *sessionStorage) Get(key string) ([]byte, error) {
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

// Set stores val under key for exp (0: no expiry).
func (s *sessionStorage) Set(key string, val []byte, exp time.Duration) error {
	ctx, cancel := s.ctx()
	defer cancel()
	row := models.Session{ID: key, Data: val}
	if exp > 0 {
		t := time.Now().UTC().Add(exp)
		row.ExpiresAt = &t
	}
	return s.db.WithContext(ctx).Clauses(clause.OnConflict{
		Columns:   []clause.Column{{Name: "id"}},
		DoUpdates: clause.AssignmentColumns([]string{"data", "expires_at"}),
	}).Create(&row).Error
}

// Delete removes key.
func (s *sessionStorage) Delete(key string) error {
	ctx, cancel := s.ctx()
	defer cancel()
	return s.db.WithContext(ctx).Where("id = ?", key).Delete(&models.Session{}).Error
}

// Reset removes every session.
func (s *sessionStorage) Reset() error {
	ctx, cancel := s.ctx()
	defer cancel()
	return s.db.WithContext(ctx).Where("1 = 1").Delete(&models.Session{}).Error
}

// Close does nothing: the pool belongs to the caller.
func (s *sessionStorage) Close() error { return nil }
