package services

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/idemgate/idemgate/models"
	"golang.org/x/crypto/bcrypt"
	"gorm.io/gorm"
)

// Account and tenant administration for the command line (docs/reference.md §7): like the
// admin page's methods (admin.go) each takes the acting account and requires a global admin;
// the command line acts as one, since whoever runs it holds the database's credentials.

// TenantInfo is a tenant as `idemgate tenant list` shows it: its API keys counted, never
// listed.
type TenantInfo struct {
	Name       string
	CreatedAt  time.Time
	APIKeys    int64 // every API key of the tenant, revoked ones included
	ActiveKeys int64 // API keys not revoked
}

// ErrPasswordMismatch: the two entries of a new password typed at a prompt differ.
var ErrPasswordMismatch = errors.New("the two passwords differ")

// ValidatePassword returns what is wrong with password as an operator password, or "": the
// rule of CreateOperator (docs/reference.md §7: at least MinPasswordChars characters), and at
// most 72 bytes, all bcrypt reads.
func ValidatePassword(password string) string {
	if utf8.RuneCountInString(password) < MinPasswordChars || len(password) > 72 {
		return fmt.Sprintf("must be %d to 72 bytes", MinPasswordChars)
	}
	return ""
}

// OperatorByUsername returns the account called username. Errors: ErrUnauthorized unless acct
// is a global admin, ErrNotFound, ErrStoreUnavailable.
func (a *Auth) OperatorByUsername(ctx context.Context, acct *OperatorAccount, username string) (*OperatorAccount, error) {
	if err := requireGlobalAdmin(acct); err != nil {
		return nil, err
	}
	var op models.Operator
	err := a.db.WithContext(ctx).Where("username = ?", username).Take(&op).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, ErrNotFound
	} else if err != nil {
		return nil, storeError("get operator", err)
	}
	return &OperatorAccount{ID: op.ID, Username: op.Username, Role: op.Role, TenantID: op.TenantID}, nil
}

// SetOperatorPassword replaces account id's password (bcrypt, like CreateOperator). Sessions
// already signed in stay signed in. Errors: ErrUnauthorized unless acct is a global admin,
// ErrInvalidRequest for a password ValidatePassword refuses, ErrNotFound, ErrStoreUnavailable.
func (a *Auth) SetOperatorPassword(ctx context.Context, acct *OperatorAccount, id int64, password string) error {
	if err := requireGlobalAdmin(acct); err != nil {
		return err
	}
	if msg := ValidatePassword(password); msg != "" {
		return invalid(FieldError{Field: "password", Message: msg})
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.DefaultCost)
	if err != nil {
		return err
	}
	var changed int64
	err = a.db.Write(ctx, func(db *gorm.DB) error {
		res := db.Model(&models.Operator{}).Where("id = ?", id).Update("password_hash", string(hash))
		changed = res.RowsAffected
		return res.Error
	})
	if err != nil {
		return storeError("set operator password", err)
	}
	if changed == 0 {
		return ErrNotFound
	}
	a.log.InfoContext(ctx, "operator password changed", "by", acct.Username, "operator_id", id)
	return nil
}

// ListTenants returns every tenant by name (at most 1000) with its API key counts. Errors:
// ErrUnauthorized unless acct is a global admin, ErrStoreUnavailable.
func (a *Auth) ListTenants(ctx context.Context, acct *OperatorAccount) ([]TenantInfo, error) {
	if err := requireGlobalAdmin(acct); err != nil {
		return nil, err
	}
	var rows []struct {
		Name       string
		CreatedAt  time.Time
		APIKeys    int64
		ActiveKeys int64
	}
	err := a.db.WithContext(ctx).Table("tenants AS t").
		Select("t.name, t.created_at, COUNT(k.id) AS api_keys, " +
			"COALESCE(SUM(CASE WHEN k.id IS NOT NULL AND k.revoked_at IS NULL THEN 1 ELSE 0 END), 0) AS active_keys").
		Joins("LEFT JOIN api_keys k ON k.tenant_id = t.id").
		Group("t.id, t.name, t.created_at").Order("t.name").Limit(maxAdminRows).Scan(&rows).Error
	if err != nil {
		return nil, storeError("list tenants", err)
	}
	out := make([]TenantInfo, 0, len(rows))
	for _, r := range rows {
		out = append(out, TenantInfo{Name: r.Name, CreatedAt: r.CreatedAt.UTC(), APIKeys: r.APIKeys, ActiveKeys: r.ActiveKeys})
	}
	return out, nil
}

// ErrLastAdmin refuses to delete or demote the last global admin (an installation must keep
// one to be administrable). errors.Is matches it by code, invalid_request, so test for it only
// on errors of DeleteOperator and SetOperatorRole, which have no other invalid_request.
var ErrLastAdmin = errLastAdmin
