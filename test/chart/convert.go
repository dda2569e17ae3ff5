package chart

import "k8s.io/apimachinery/pkg/runtime"

func runtimeConvert(m map[string]any, out any) error {
	return runtime.DefaultUnstructuredConverter.FromUnstructured(m, out)
}
