// Command crd-versions adds the API versions a CRD still serves beside the one the Go types
// define. controller-gen writes one version per Go package; numastream.io/v1alpha1 has the same
// schema as v1beta1 (the Go types moved, no field changed), so it is served from a copy of the
// storage version's schema, deprecated, and the API server converts between them by rewriting
// apiVersion alone (conversion strategy None). A version whose schema differs would need a
// conversion webhook instead: this command refuses to be used for that by construction, since
// the copy is the only schema it can give.
//
//	go run ./hack/crd-versions -served v1alpha1 FILE...
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"sigs.k8s.io/yaml"
)

func main() {
	served := flag.String("served", "", "comma-separated versions to serve, deprecated, with the storage version's schema")
	flag.Parse()
	if *served == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: crd-versions -served v1alpha1 CRD.yaml...")
		os.Exit(2)
	}
	for _, path := range flag.Args() {
		if err := addVersions(path, strings.Split(*served, ",")); err != nil {
			fmt.Fprintf(os.Stderr, "crd-versions: %s: %v\n", path, err)
			os.Exit(1)
		}
	}
}

func addVersions(path string, served []string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var crd map[string]any
	if err := yaml.Unmarshal(data, &crd); err != nil {
		return err
	}
	spec, _ := crd["spec"].(map[string]any)
	versions, _ := spec["versions"].([]any)
	var storage map[string]any
	for _, v := range versions {
		m := v.(map[string]any)
		if m["storage"] == true {
			storage = m
		}
		for _, s := range served {
			if m["name"] == s {
				return fmt.Errorf("version %s is already in the CRD", s)
			}
		}
	}
	if storage == nil {
		return fmt.Errorf("no storage version")
	}
	kind := spec["names"].(map[string]any)["kind"]
	group := spec["group"]
	for _, s := range served {
		copied := map[string]any{}
		for k, v := range storage {
			copied[k] = v
		}
		copied["name"], copied["storage"], copied["served"] = s, false, true
		copied["deprecated"] = true
		copied["deprecationWarning"] = fmt.Sprintf("%s/%s %s is deprecated: use %s/%s (the same fields)", group, s, kind, group, storage["name"])
		versions = append(versions, copied)
	}
	spec["versions"] = versions
	out, err := yaml.Marshal(crd)
	if err != nil {
		return err
	}
	return os.WriteFile(path, append([]byte("---\n"), out...), 0o644)
}
