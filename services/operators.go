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

// Dashboard accounts (operators), as Accounts administers them: see Accounts for who may act.

// MinPasswordChars is the shortest operator password accepted (docs/reference.md §7).
const MinPasswordChars = 12

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

// errLastAdmin keeps an installation administrable: without a global admin nobody could
// create accounts or revoke keys from the dashboard any more.
var errLastAdmin = &Error{Code: CodeInvalidRequest,
	Message: "This is the last global admin account: an installation must keep one. Make another account a global admin first."}

// ErrLastAdmin refuses to delete or demote the last global admin (an installation must keep
// one to be administrable). errors.Is matches it by code, invalid_request, so test for it only
// on errors of DeleteOperator and SetOperatorRole, which have no other invalid_request.
var ErrLastAdmin = errLastAdmin

// OperatorInfo is a dashboard account as the admin page shows it. Tenant is "" for a global
// account.
type OperatorInfo struct {
	ID        int64
	Username  string
	Role      string
	Tenant    string
	CreatedAt time.Time
}

// CreateOperator creates a dashboard account (docs/reference.md §7 "operator create"). role is
// admin, operator or auditor; tenant "" makes a global account, otherwise the tenant must
// exist. by is the acting account, Installation() for the installation (see Accounts); an account must be
// a global admin, and the new account is logged under its username. Errors: ErrUnauthorized,
// ErrInvalidRequest (bad username, role, short password, unknown tenant, taken username),
// ErrStoreUnavailable.
func (ac *Accounts) CreateOperator(ctx context.Context, by *OperatorAccount, username, password, role, tenant string) (*OperatorAccount, error) {
	if err := mayCreateOrRevoke(by); err != nil {
		return nil, err
	}
	var fe []FieldError
	if msg := ValidateOperationName(username); msg != "" {
		fe = append(fe, FieldError{Field: "username", Message: msg})
	}
	if !validRole(role) {
		fe = append(fe, FieldError{Field: "role", Message: "must be admin, operator or auditor"})
	}
	if msg := ValidatePassword(password); msg != "" {
		fe = append(fe, FieldError{Field: "password", Message: msg})
	}
	if len(fe) > 0 {
		return nil, invalid(fe...)
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.DefaultCost)
	if err != nil {
		return nil, err
	}
	op := models.Operator{Username: username, PasswordHash: string(hash), Role: role, CreatedAt: time.Now().UTC()}
	err = ac.db.Tx(ctx, func(tx *gorm.DB) error {
		if tenant != "" {
			var t models.Tenant
			if err := tx.Where("name = ?", tenant).Take(&t).Error; errors.Is(err, gorm.ErrRecordNotFound) {
				return invalid(FieldError{Field: "tenant", Message: "no such tenant"})
			} else if err != nil {
				return err
			}
			op.TenantID = &t.ID
		}
		err := tx.Create(&op).Error
		if errors.Is(err, gorm.ErrDuplicatedKey) {
			return invalid(FieldError{Field: "username", Message: "is taken"})
		}
		return err
	})
	if err != nil {
		return nil, storeError("create operator", err)
	}
	if by != installation {
		ac.log.InfoContext(ctx, "operator created", "by", by.Username, "username", op.Username, "role", op.Role)
	}
	return &OperatorAccount{ID: op.ID, Username: op.Username, Role: op.Role, TenantID: op.TenantID}, nil
}

// validRole reports whether role is one an account can have.
func validRole(role string) bool {
	switch role {
	case RoleAdmin, RoleOperator, RoleAuditor:
		return true
	}
	return false
}

// isTaken reports whether err is CreateOperator's refusal of a taken username.
func isTaken(err error) bool {
	var e *Error
	if errors.As(err, &e) {
		for _, f := range e.Fields {
			if f.Field == "username" && f.Message == "is taken" {
				return true
			}
		}
	}
	return false
}

// OperatorByUsername returns the account called username. Errors: ErrUnauthorized unless by
// is a global admin, ErrNotFound, ErrStoreUnavailable.
func (ac *Accounts) OperatorByUsername(ctx context.Context, by *OperatorAccount, username string) (*OperatorAccount, error) {
	if err := requireGlobalAdmin(by); err != nil {
		return nil, err
	}
	var op models.Operator
	err := ac.db.WithContext(ctx).Where("username = ?", username).Take(&op).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, ErrNotFound
	} else if err != nil {
		return nil, storeError("get operator", err)
	}
	return &OperatorAccount{ID: op.ID, Username: op.Username, Role: op.Role, TenantID: op.TenantID}, nil
}

// ListOperators returns the dashboard accounts by username (at most 1000). Errors:
// ErrUnauthorized unless by is a global admin, ErrStoreUnavailable.
func (ac *Accounts) ListOperators(ctx context.Context, by *OperatorAccount) ([]OperatorInfo, error) {
	if err := requireGlobalAdmin(by); err != nil {
		return nil, err
	}
	var rows []struct {
		ID        int64
		Username  string
		Role      string
		Tenant    *string
		CreatedAt time.Time
	}
	err := ac.db.WithContext(ctx).Table("operators AS o").
		Select("o.id, o.username, o.role, t.name AS tenant, o.created_at").
		Joins("LEFT JOIN tenants t ON t.id = o.tenant_id").
		Order("o.username").Limit(maxAdminRows).Scan(&rows).Error
	if err != nil {
		return nil, storeError("list operators", err)
	}
	out := make([]OperatorInfo, 0, len(rows))
	for _, r := range rows {
		info := OperatorInfo{ID: r.ID, Username: r.Username, Role: r.Role, CreatedAt: r.CreatedAt.UTC()}
		if r.Tenant != nil {
			info.Tenant = *r.Tenant
		}
		out = append(out, info)
	}
	return out, nil
}

// SetOperatorRole changes account id's role. The dashboard reads the account on every
// request, so the change applies to its open sessions at their next request. Errors:
// ErrUnauthorized unless by is a global admin, ErrInvalidRequest for an unknown role or for
// demoting the last global admin, ErrNotFound, ErrStoreUnavailable.
func (ac *Accounts) SetOperatorRole(ctx context.Context, by *OperatorAccount, id int64, role string) error {
	if err := requireGlobalAdmin(by); err != nil {
		return err
	}
	if !validRole(role) {
		return invalid(FieldError{Field: "role", Message: "must be admin, operator or auditor"})
	}
	err := ac.db.Tx(ctx, func(tx *gorm.DB) error {
		op, err := ac.lockForAdminChange(tx, id)
		if err != nil {
			return err
		}
		if role != RoleAdmin {
			if err := keepsAnAdmin(tx, op); err != nil {
				return err
			}
		}
		return tx.Model(&models.Operator{}).Where("id = ?", id).Update("role", role).Error
	})
	if err != nil {
		return storeError("set operator role", err)
	}
	ac.log.InfoContext(ctx, "operator role changed", "by", by.Username, "operator_id", id, "role", role)
	return nil
}

// SetOperatorPassword replaces account id's password (bcrypt, like CreateOperator). Sessions
// already signed in stay signed in. Errors: ErrUnauthorized unless by is a global admin,
// ErrInvalidRequest for a password ValidatePassword refuses, ErrNotFound, ErrStoreUnavailable.
func (ac *Accounts) SetOperatorPassword(ctx context.Context, by *OperatorAccount, id int64, password string) error {
	if err := requireGlobalAdmin(by); err != nil {
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
	err = ac.db.Write(ctx, func(db *gorm.DB) error {
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
	ac.log.InfoContext(ctx, "operator password changed", "by", by.Username, "operator_id", id)
	return nil
}

// DeleteOperator deletes account id. Its open sessions end at their next request, because the
// dashboard reads the account on every request and treats a missing one as signed out.
// Errors: ErrUnauthorized unless by is a global admin, ErrInvalidRequest for the last global
// admin, ErrNotFound, ErrStoreUnavailable.
func (ac *Accounts) DeleteOperator(ctx context.Context, by *OperatorAccount, id int64) error {
	if err := requireGlobalAdmin(by); err != nil {
		return err
	}
	err := ac.db.Tx(ctx, func(tx *gorm.DB) error {
		op, err := ac.lockForAdminChange(tx, id)
		if err != nil {
			return err
		}
		if err := keepsAnAdmin(tx, op); err != nil {
			return err
		}
		return tx.Where("id = ?", id).Delete(&models.Operator{}).Error
	})
	if err != nil {
		return storeError("delete operator", err)
	}
	ac.log.InfoContext(ctx, "operator deleted", "by", by.Username, "operator_id", id)
	return nil
}

// lockForAdminChange reads account id for a role change or deletion. It first locks every
// global admin row, so two admins demoting each other at once are serialised and the second
// sees the first's change (on SQLite the immediate transaction already is the lock).
func (ac *Accounts) lockForAdminChange(tx *gorm.DB, id int64) (*models.Operator, error) {
	var ids []int64
	if err := ac.st.lock(tx.Model(&models.Operator{})).
		Where("role = ? AND tenant_id IS NULL", RoleAdmin).Pluck("id", &ids).Error; err != nil {
		return nil, err
	}
	var op models.Operator
	err := tx.Where("id = ?", id).Take(&op).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, ErrNotFound
	}
	return &op, err
}

// keepsAnAdmin refuses to take op away as a global admin when it is the last one.
func keepsAnAdmin(tx *gorm.DB, op *models.Operator) error {
	if op.Role != RoleAdmin || op.TenantID != nil {
		return nil
	}
	var others int64
	if err := tx.Model(&models.Operator{}).Where("role = ? AND tenant_id IS NULL AND id <> ?", RoleAdmin, op.ID).
		Count(&others).Error; err != nil {
		return err
	}
	if others == 0 {
		return errLastAdmin
	}
	return nil
}
