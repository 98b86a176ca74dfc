//! The configuration file (`linerate::config`): TOML parsing and `Config::validate`.
//!
//! Input: a mode byte, then either
//! - (even) TOML text, as the operator would write it (invalid UTF-8 is replaced, as
//!   the file would be refused before parsing), or
//! - (odd) edits to a valid configuration: each picks a key (every key of the
//!   serialised default configuration, plus optional keys, map entries and unknown
//!   names) and sets it to a value chosen among boundaries, durations, names and
//!   raw strings, or removes it. This reaches validation rather than stopping at
//!   TOML syntax errors.
//!
//! Properties:
//! - parsing and validation never panic;
//! - a parse error is one non-empty line and names a key or a location (`line N`);
//!   with edits, the key it names is one that was edited (or its table, or a field
//!   inside it);
//! - a validation error is one non-empty line and names a key the configuration
//!   has (or an optional one it lacks: `root`, `tls.cert`, `tls.key`);
//! - an accepted (parsed and validated) configuration prints (`Config::to_toml`, what
//!   `--check-config` shows) as TOML that parses back to the same configuration,
//!   which validates and prints to the same text (a fixed point);
//! - the unedited base configuration validates.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use linerate::config::Config;
use toml::{Table, Value};

/// The configuration the edits start from: valid as it is.
fn base() -> Config {
    Config { root: Some("/".into()), listen: vec!["127.0.0.1:0".parse().unwrap()], ..Config::default() }
}

fn base_table() -> &'static Table {
    static T: OnceLock<Table> = OnceLock::new();
    T.get_or_init(|| Table::try_from(base()).expect("the configuration serialises"))
}

/// Names for map entries (media types, NIC and disk nodes) and unknown keys.
const NAMES: &[&str] = &["mp4", "", ".mp4", "a/b", "m3u8", "eth0", "sda", "x y", "é", "max_head", "bogus"];

/// Every key the edits can reach, as paths.
fn keys() -> &'static Vec<Vec<String>> {
    static K: OnceLock<Vec<Vec<String>>> = OnceLock::new();
    K.get_or_init(|| {
        fn walk(t: &Table, prefix: &[String], out: &mut Vec<Vec<String>>) {
            for (k, v) in t {
                let mut p = prefix.to_vec();
                p.push(k.clone());
                out.push(p.clone());
                if let Value::Table(inner) = v {
                    walk(inner, &p, out);
                }
            }
        }
        let mut out = Vec::new();
        walk(base_table(), &[], &mut out);
        for optional in ["tls.cert", "tls.key", "root"] {
            out.push(optional.split('.').map(String::from).collect());
        }
        for map in ["mime", "numa.nic_nodes", "numa.disk_nodes", "limits", ""] {
            for name in NAMES {
                let mut p: Vec<String> = map.split('.').filter(|s| !s.is_empty()).map(String::from).collect();
                p.push(name.to_string());
                out.push(p);
            }
        }
        out.sort();
        out.dedup();
        out
    })
}

const INTS: &[i64] = &[
    0,
    1,
    -1,
    2,
    15,
    16,
    63,
    64,
    65,
    100,
    256,
    257,
    1023,
    1024,
    1025,
    4095,
    4096,
    10_000,
    65_535,
    65_536,
    1 << 20,
    (1 << 20) + 1,
    2 << 20,
    64 << 20,
    (64 << 20) + 4096,
    i64::MAX,
    i64::MIN,
    u32::MAX as i64,
    u32::MAX as i64 + 1,
];

const FLOATS: &[f64] =
    &[0.0, -0.0, 0.01, 0.5, 1.0, 1.000_000_1, -1e-9, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1e308, 5e-324, 10.0];

const STRINGS: &[&str] = &[
    "0s",
    "1ns",
    "1ms",
    "9ms",
    "10ms",
    "99ms",
    "100ms",
    "1s",
    "1h",
    "1h 1ns",
    "1day",
    "1day 1ns",
    "2days",
    "1000000000y",
    "soon",
    "",
    "bbr",
    "cubic",
    "a-b",
    "0123456789abcdef",
    "index.html",
    "..",
    ".",
    "a/b",
    "eth0",
    "video/mp4",
    "text",
    "info",
    "linerate=debug,warn",
    "[[[",
    "debug,[{x=/.*/}]",
    "a\r\nb",
    "\u{7f}",
    "*",
    "https://example.com",
    "1.2",
    "1.3",
    "auto",
    "off",
    "domain",
    "cpu",
    "hash",
    "network",
    "disk",
    "json",
    "127.0.0.1:8080",
    "127.0.0.1:9090",
    "[::1]:0",
    "127.0.0.1:0",
    "[fe80::1%2]:80",
    "localhost:80",
    "/",
    "/nonexistent",
    "/proc",
];

/// Reads the edits' bytes.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }
    fn take(&mut self, n: usize) -> &[u8] {
        let (a, b) = self.0.split_at(n.min(self.0.len()));
        self.0 = b;
        a
    }
    fn pick<T: Copy>(&mut self, table: &[T]) -> T {
        table[usize::from(self.byte().unwrap_or(0)) % table.len()]
    }
}

fn value(b: &mut Bytes<'_>) -> Option<Value> {
    Some(match b.byte()? % 7 {
        0 => {
            let sel = usize::from(b.byte()?);
            Value::Integer(match INTS.get(sel) {
                Some(&v) => v,
                None if sel < 128 => sel as i64 - 64,
                None => {
                    let mut raw = [0u8; 8];
                    let got = b.take(8);
                    raw[..got.len()].copy_from_slice(got);
                    i64::from_le_bytes(raw)
                }
            })
        }
        1 => Value::Float(b.pick(FLOATS)),
        2 => Value::Boolean(b.byte()? & 1 == 1),
        3 => Value::String(b.pick(STRINGS).to_string()),
        4 => {
            let n = usize::from(b.byte()?);
            Value::String(String::from_utf8_lossy(b.take(n)).into_owned())
        }
        5 => {
            let n = b.byte()? % 5;
            Value::Array((0..n).map(|_| Value::String(b.pick(STRINGS).to_string())).collect())
        }
        _ => {
            let mut t = Table::new();
            match b.byte()? % 3 {
                0 => {}
                1 => {
                    t.insert("cert".into(), Value::String("c.pem".into()));
                    t.insert("key".into(), Value::String("k.pem".into()));
                }
                _ => return Some(Value::Array(vec![Value::Table(t.clone()), Value::Table(t)])),
            }
            Value::Table(t)
        }
    })
}

/// Sets (or with `None` removes) the value at `path`, creating tables on the way.
fn set(t: &mut Table, path: &[String], v: Option<Value>) {
    let (last, parents) = path.split_last().expect("keys are never empty");
    let mut t = t;
    for p in parents {
        let entry = t.entry(p.clone()).or_insert_with(|| Value::Table(Table::new()));
        if !entry.is_table() {
            *entry = Value::Table(Table::new());
        }
        t = entry.as_table_mut().unwrap();
    }
    match v {
        Some(v) => {
            t.insert(last.clone(), v);
        }
        None => {
            t.remove(last);
        }
    }
}

/// `a[0].b` → `a.b`: the path without array indexes.
fn without_indexes(key: &str) -> String {
    let mut out = String::new();
    let mut depth = 0;
    for c in key.chars() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out
}

fn one_line(problem: &str) {
    assert!(!problem.is_empty(), "an empty problem");
    assert!(!problem.contains('\n'), "a problem on several lines: {problem:?}");
}

/// Is `key` (as validation names it) a key of the configuration? Every key but the
/// optional ones is in the default configuration's TOML; `mime.EXT` must be an
/// extension the configuration has.
fn has_key(c: &Config, key: &str) -> bool {
    if ["root", "tls.cert", "tls.key"].contains(&key) {
        return true;
    }
    if let Some(ext) = key.strip_prefix("mime.") {
        return c.mime.contains_key(ext);
    }
    let mut v = default_table();
    for part in key.split('.') {
        match v.get(part) {
            Some(inner) => v = inner,
            None => return false,
        }
    }
    true
}

fn default_table() -> &'static Value {
    static T: OnceLock<Value> = OnceLock::new();
    T.get_or_init(|| Value::try_from(Config::default()).expect("the default configuration serialises"))
}

fn check(text: &str, edited: Option<&[String]>) {
    let c = match Config::from_toml(text) {
        Err((key, problem)) => {
            one_line(&problem);
            if key.is_empty() {
                assert!(problem.contains("line "), "no key and no location: {problem:?}\n{text}");
            }
            if let (Some(edited), false) = (edited, key.is_empty()) {
                let key = without_indexes(&key);
                assert!(
                    edited
                        .iter()
                        .any(|k| *k == key || k.starts_with(&format!("{key}.")) || key.starts_with(&format!("{k}."))),
                    "error names {key:?}, edited {edited:?}: {problem}\n{text}"
                );
            }
            return;
        }
        Ok(c) => c,
    };
    if let Err((key, problem)) = c.validate() {
        one_line(&problem);
        assert!(has_key(&c, &key), "validation names {key:?}, not a key of the configuration: {problem}");
        assert!(edited.is_none_or(|e| !e.is_empty()), "the base configuration does not validate: {key}: {problem}");
        return;
    }
    // Accepted: what `--check-config` prints is a configuration file that loads
    // back to the same configuration.
    let printed = c.to_toml();
    let again =
        Config::from_toml(&printed).unwrap_or_else(|e| panic!("printed config does not parse: {e:?}\n{printed}"));
    // Debug, not PartialEq: a NaN fraction is the same configuration.
    assert_eq!(format!("{again:?}"), format!("{c:?}"), "round trip changed the configuration\n{printed}");
    assert_eq!(again.to_toml(), printed, "printing is not a fixed point");
    assert_eq!(again.validate(), Ok(()), "the printed configuration does not validate\n{printed}");
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    if mode % 2 == 0 {
        check(&String::from_utf8_lossy(rest), None);
        return;
    }
    let mut table = base_table().clone();
    let mut b = Bytes(rest);
    let mut edited = Vec::new();
    while let Some(k) = b.byte() {
        let k2 = b.byte().unwrap_or(0);
        let keys = keys();
        let key = &keys[(usize::from(k) << 8 | usize::from(k2)) % keys.len()];
        let Some(kind) = b.byte() else { break };
        let v = if kind == 0 { None } else { value(&mut b) };
        if kind != 0 && v.is_none() {
            break;
        }
        set(&mut table, key, v);
        edited.push(key.join("."));
    }
    let Ok(text) = toml::to_string(&table) else { return };
    check(&text, Some(&edited));
});
