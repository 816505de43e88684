// Package services is idemgate's domain logic: admission (acquire), owner-checked release,
// outcomes, reads of keys, operations and attempts, the reaper, and authentication of API keys
// and operators. It knows nothing of HTTP; web/ maps its typed errors (errors.go) to status
// codes in one place.
//
// Every rule here comes from ../shared/SPEC.md; comments cite its sections.
package services
