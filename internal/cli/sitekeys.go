package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
)

// siteKeys are the keys a RemoteSite's status says the far receiver must admit, in its order,
// and who uses each (pipeline/use).
func siteKeys(ctx context.Context, e Env, name string) (keys, users []string, err error) {
	site := &v1beta1.RemoteSite{}
	if err := e.Client.Get(ctx, client.ObjectKey{Namespace: e.Namespace, Name: name}, site); err != nil {
		return nil, nil, fmt.Errorf("remotesite %s/%s: %w", e.Namespace, name, err)
	}
	for _, k := range site.Status.AdmittedKeys {
		keys = append(keys, k.Key)
		users = append(users, k.Pipeline+"/"+k.Use)
	}
	return keys, users, nil
}

// SiteKeys prints the keys a RemoteSite's far receiver must admit, one per line: the contents of
// its allowed-keys file (security.curve.allowed_keys_file).
func SiteKeys(ctx context.Context, e Env, name string) error {
	keys, _, err := siteKeys(ctx, e, name)
	if err != nil {
		return err
	}
	for _, k := range keys {
		if _, err := fmt.Fprintln(e.Out, k); err != nil {
			return err
		}
	}
	return nil
}

// FollowSiteKeys keeps file as the RemoteSite's far receiver's allowed-keys file until ctx ends:
// it reads the site every interval and, when the keys it lists change, writes them beside file
// and renames that over it (a receiver reading the file sees the old keys or the new, never
// part). A site that lists no key leaves the file as it is (a receiver given no key admits no
// one, and keeps what it admitted). Each change is said on e.Out. An API error ends it, as does a
// file it cannot write.
func FollowSiteKeys(ctx context.Context, e Env, name, file string, interval time.Duration) error {
	var written []string
	empty := false
	for {
		keys, users, err := siteKeys(ctx, e, name)
		if err != nil {
			if ctx.Err() != nil {
				return nil //nolint:nilerr // stopped (Ctrl-C, SIGTERM): the read it interrupted is not an error
			}
			return err
		}
		switch {
		case len(keys) == 0 && !empty:
			fmt.Fprintf(e.Out, "%s: remotesite %s lists no key: %s left as it is\n", time.Now().UTC().Format(time.RFC3339), name, file)
		case len(keys) > 0 && !slices.Equal(keys, written):
			if err := replaceFile(file, strings.Join(keys, "\n")+"\n"); err != nil {
				return err
			}
			written = keys
			fmt.Fprintf(e.Out, "%s: %s admits %d key(s): %s\n", time.Now().UTC().Format(time.RFC3339), file, len(keys), strings.Join(users, ", "))
		}
		empty = len(keys) == 0
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(interval):
		}
	}
}

// replaceFile writes text to a new file beside path (mode 0600) and renames it over path.
func replaceFile(path, text string) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".")
	if err != nil {
		return err
	}
	if _, err := tmp.WriteString(text); err != nil {
		_ = tmp.Close()
		_ = os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		_ = os.Remove(tmp.Name())
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		_ = os.Remove(tmp.Name())
		return err
	}
	return nil
}
