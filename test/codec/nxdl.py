"""What a NeXus application definition requires of a file, read from the definition itself.

The NXDL files are NeXus's own (nexusformat/definitions, as the pynxtools wheel ships them:
hack/requirements-nxdl.txt; the package is never imported). `problems(h5file, "NXmx")` walks the
definition against an open h5py file and returns what it finds wrong, each naming the path:

- a required group (no optional/recommended, minOccurs not 0) with no group of its NX_class,
  a required field or attribute (attributes: optional="false") absent;
- a field whose value is not one of the definition's enumeration (definition = "NXmx");
- a field present whose definition gives units without a `units` attribute;
- a field present of the wrong kind: NX_CHAR not text, NX_DATE_TIME not ISO 8601,
  NX_INT not integers, NX_FLOAT / NX_NUMBER not numbers, NX_BOOLEAN not a boolean or integer.

Groups the definition names (name="...") are looked for by name, the others by NX_class: every
group of that class is checked. `choice` elements and partial names (nameType="partial") are left
out (NXmx uses them only for optional parts).
"""
import importlib.util
import os
import re
import xml.etree.ElementTree as ET

import h5py
import numpy as np

NS = "{http://definition.nexusformat.org/nxdl/3.1}"
ISO8601 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")


def definition_path(name):
    spec = importlib.util.find_spec("pynxtools")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the NeXus definitions are not installed: run hack/pyenv.sh (hack/requirements-nxdl.txt)")
    return os.path.join(spec.submodule_search_locations[0], "definitions", "applications", name + ".nxdl.xml")


def required(element):
    if element.tag == NS + "attribute":
        return element.get("optional") == "false"
    return not (element.get("optional") == "true" or element.get("recommended") == "true"
                or element.get("minOccurs") == "0")


def text_of(value):
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, np.ndarray) and value.shape == () and value.dtype.kind in "OS":
        return text_of(value[()])
    return value if isinstance(value, str) else None


def kind_problem(nxtype, ds):
    """By the dataset's type; values are read only for text (a scalar or a short list)."""
    if nxtype is None or nxtype == "NX_CHAR_OR_NUMBER":
        return None
    kind = ds.dtype.kind
    if nxtype in ("NX_CHAR", "NX_DATE_TIME"):
        if kind not in "OSU" or ds.size > 64:
            return f"is {ds.dtype}{list(ds.shape)}, not text ({nxtype})"
        value = ds[()]
        texts = [text_of(v) for v in np.ravel(value)] if ds.shape else [text_of(value)]
        if any(t is None for t in texts):
            return f"is {ds.dtype}, not text ({nxtype})"
        if nxtype == "NX_DATE_TIME" and not all(ISO8601.match(t) for t in texts):
            return f"is {texts!r}, not an ISO 8601 date and time"
        return None
    if nxtype in ("NX_INT", "NX_POSINT") and kind not in "iu":
        return f"is {ds.dtype}, not integers ({nxtype})"
    if nxtype in ("NX_FLOAT", "NX_NUMBER") and kind not in "iuf":
        return f"is {ds.dtype}, not numbers ({nxtype})"
    if nxtype == "NX_BOOLEAN" and kind not in "biu":
        return f"is {ds.dtype}, not a boolean ({nxtype})"
    return None


def check_group(definition, group, path, out):
    for element in definition:
        tag = element.tag[len(NS):] if element.tag.startswith(NS) else element.tag
        name = element.get("name")
        if tag == "attribute":
            if required(element) and name not in group.attrs:
                out.append(f"{path}@{name}: required attribute absent")
        elif tag == "field":
            if name not in group:
                if required(element):
                    out.append(f"{path}/{name}: required field absent")
                continue
            ds = group[name]
            if not isinstance(ds, h5py.Dataset):
                out.append(f"{path}/{name}: a field, but not a dataset")
                continue
            allowed = [i.get("value") for i in element.iter(NS + "item")]
            enum = element.find(NS + "enumeration")
            if enum is not None and allowed and enum.get("open") != "true" and ds.size == 1 and ds.dtype.kind in "OSU":
                value = text_of(ds[()])
                if value is not None and value not in allowed:
                    out.append(f"{path}/{name}: {value!r} is not one of {allowed}")
            if element.get("units") and "units" not in ds.attrs:
                out.append(f"{path}/{name}: no units attribute ({element.get('units')})")
            problem = kind_problem(element.get("type"), ds)
            if problem:
                out.append(f"{path}/{name}: {problem}")
            for attribute in element.findall(NS + "attribute"):
                if required(attribute) and attribute.get("name") not in ds.attrs:
                    out.append(f"{path}/{name}@{attribute.get('name')}: required attribute absent")
        elif tag == "group":
            if element.get("nameType") == "partial":
                continue
            nx_class = element.get("type")
            if name and name.upper() != name:  # a name the definition fixes
                children = [group[name]] if name in group and isinstance(group[name], h5py.Group) else []
            else:
                children = []
                for key in group:
                    try:
                        g = group[key]
                    except KeyError:  # a link to a file not (yet) there
                        continue
                    if isinstance(g, h5py.Group) and text_of(g.attrs.get("NX_class")) == nx_class:
                        children.append(g)
            if not children and required(element):
                out.append(f"{path}: no {nx_class} group{' ' + name if name and name.upper() != name else ''}"
                           " (required)")
            for child in children:
                check_group(element, child, child.name, out)


def problems(h5file, application="NXmx"):
    """What `h5file` (an open h5py.File) lacks or gets wrong for `application`, or []."""
    root = ET.parse(definition_path(application)).getroot()
    out = []
    check_group(root, h5file, "", out)
    return out
