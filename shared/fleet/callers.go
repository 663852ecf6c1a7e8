package fleet

import (
	"context"
	"errors"
	"fmt"

	"github.com/runfleet/runfleet/shared/auth"
	"github.com/runfleet/runfleet/shared/store"
)

// CallerSpec is a mint: POST /fleet/callers.
type CallerSpec struct {
	OwnerID string
	// AllowedHosts and AllowedProjects are required for a non-admin; nil
	// for an admin means every one.
	AllowedHosts    *store.Scope
	AllowedProjects *store.Scope
	Admin           bool
}

// MintCaller creates a caller and returns it with its token, which is shown
// once: only its hash is stored.
func (f *Fleet) MintCaller(ctx context.Context, spec CallerSpec) (store.Caller, string, error) {
	if err := auth.CheckOwnerID(spec.OwnerID); err != nil {
		if errors.Is(err, auth.ErrReservedOwner) {
			return store.Caller{}, "", conflict(CodeOwnerReserved, nil, "%v", err)
		}
		return store.Caller{}, "", invalid("%v", err)
	}
	hosts, err := scopeOrDefault("allowedHosts", spec.AllowedHosts, spec.Admin)
	if err != nil {
		return store.Caller{}, "", err
	}
	projects, err := scopeOrDefault("allowedProjects", spec.AllowedProjects, spec.Admin)
	if err != nil {
		return store.Caller{}, "", err
	}
	token, hash, rerr := auth.MintToken(f.cfg.Random)
	if rerr != nil {
		return store.Caller{}, "", fmt.Errorf("fleet: minting a token for %q: %w", spec.OwnerID, rerr)
	}
	c := store.Caller{
		OwnerID:         spec.OwnerID,
		TokenHash:       hash,
		Admin:           spec.Admin,
		AllowedHosts:    hosts,
		AllowedProjects: projects,
		CreatedAt:       f.clock.Now().UTC(),
	}
	if err := f.store.CreateCaller(ctx, c); err != nil {
		if errors.Is(err, store.ErrExists) {
			return store.Caller{}, "", conflict(CodeOwnerExists, nil, "ownerId %q already exists", spec.OwnerID)
		}
		return store.Caller{}, "", fmt.Errorf("fleet: creating caller %q: %w", spec.OwnerID, err)
	}
	return c, token, nil
}

func scopeOrDefault(field string, s *store.Scope, admin bool) (store.Scope, *Error) {
	if s == nil {
		if admin {
			return store.Scope{All: true}, nil
		}
		return store.Scope{}, invalid(`%s is required: a list of ids or "*"`, field)
	}
	if s.All {
		return store.Scope{All: true}, nil
	}
	if len(s.IDs) > MaxScopeIDs {
		return store.Scope{}, invalid("%s: %d ids; at most %d (or \"*\")", field, len(s.IDs), MaxScopeIDs)
	}
	seen := map[string]bool{}
	for i, id := range s.IDs {
		if e := checkID(fmt.Sprintf("%s[%d]", field, i), id); e != nil {
			return store.Scope{}, e
		}
		if seen[id] {
			return store.Scope{}, invalid("%s[%d] %q is listed twice", field, i, id)
		}
		seen[id] = true
	}
	return store.Scope{IDs: append([]string(nil), s.IDs...)}, nil
}

// Callers lists every minted caller (never a token: none is stored).
func (f *Fleet) Callers(ctx context.Context) ([]store.Caller, error) {
	cs, err := f.store.ListCallers(ctx)
	if err != nil {
		return nil, fmt.Errorf("fleet: listing callers: %w", err)
	}
	return cs, nil
}

// RevokeCaller deletes a caller; its token stops working at once.
func (f *Fleet) RevokeCaller(ctx context.Context, ownerID string) error {
	if ownerID == auth.AdminOwnerID {
		return conflict(CodeOwnerReserved, nil, "the bootstrap admin is not a minted caller; rotate RUNFLEET_ADMIN_TOKEN instead")
	}
	if e := ownerPathID(ownerID); e != nil {
		return e
	}
	err := f.store.DeleteCaller(ctx, ownerID)
	if errors.Is(err, store.ErrNotFound) {
		return notFound("caller %q does not exist", ownerID)
	}
	if err != nil {
		return fmt.Errorf("fleet: revoking caller %q: %w", ownerID, err)
	}
	return nil
}
