package controllers

import (
	"testing"

	v1alpha1 "github.com/numastream/numastream/api/v1alpha1"
)

// Only curve costs cores per byte: the planner budgets them for it (the default), not for
// authenticate (frames travel as they are) or none.
func TestThePlannerBudgetsEncryptionOnlyForCurve(t *testing.T) {
	for mode, want := range map[v1alpha1.SecurityMode]bool{
		"": true, v1alpha1.SecurityCurve: true, v1alpha1.SecurityAuthenticate: false, v1alpha1.SecurityNone: false,
	} {
		sp := &v1alpha1.StreamPipeline{}
		if mode != "" {
			sp.Spec.Security = &v1alpha1.Security{Mode: mode}
		}
		if got := request(sp, facts{}).Encrypt; got != want {
			t.Errorf("security mode %q: planner Encrypt = %v, want %v", mode, got, want)
		}
	}
}
