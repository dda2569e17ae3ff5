package facility

import (
	"fmt"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The chart's user roles, aggregated by the box's real controller manager into Kubernetes' own
// edit and view: a namespace's editor may make and change its pipelines and far sites but not
// their status (the operator's) nor another namespace's; a viewer may read them and change
// nothing. As the API server's authorizer answers (SubjectAccessReview).
func TestNamespaceEditorsEditPipelinesAndFarSitesAndViewersReadThem(t *testing.T) {
	for user, role := range map[string]string{"edith": "edit", "victor": "view"} {
		rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "roles-test-" + user, Namespace: ns},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role},
			Subjects: []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: user}}}
		if err := k8s.Create(ctx, rb); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = k8s.Delete(ctx, rb) })
	}
	may := func(user, verb, resource, sub, namespace string) bool {
		t.Helper()
		r, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: namespace, Verb: verb,
				Group: "numastream.io", Resource: resource, Subresource: sub}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return r.Status.Allowed
	}
	cases := []struct {
		user, verb, resource, sub, namespace string
		allowed                              bool
	}{
		{"edith", "create", "streampipelines", "", ns, true},
		{"edith", "delete", "streampipelines", "", ns, true},
		{"edith", "create", "remotesites", "", ns, true},
		{"edith", "patch", "remotesites", "", ns, true},
		{"edith", "update", "streampipelines", "status", ns, false},
		{"edith", "patch", "remotesites", "status", ns, false},
		{"edith", "create", "remotesites", "", "numastream-system", false},
		{"edith", "create", "storageroots", "", "", false},
		{"victor", "get", "streampipelines", "", ns, true},
		{"victor", "list", "remotesites", "", ns, true},
		{"victor", "create", "streampipelines", "", ns, false},
		{"victor", "update", "remotesites", "", ns, false},
	}
	// The controller manager aggregates the chart's roles into edit and view within moments.
	eventually(t, "the chart's roles aggregated into edit and view", 60*time.Second, func() (bool, string) {
		var wrong []string
		for _, c := range cases {
			if may(c.user, c.verb, c.resource, c.sub, c.namespace) != c.allowed {
				wrong = append(wrong, fmt.Sprintf("%s %s %s/%s in %q: allowed %v", c.user, c.verb, c.resource, c.sub, c.namespace, !c.allowed))
			}
		}
		return len(wrong) == 0, strings.Join(wrong, "; ")
	})
}
