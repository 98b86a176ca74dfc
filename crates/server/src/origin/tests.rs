//! The origin client: routing, and the threads it runs on.

use std::time::Duration;

use super::*;
use crate::config::Origin;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A table with short timeouts, so that a test waiting on one stays fast.
fn table(prefix: &str, urls: &[String]) -> Origin {
    let mut t: Origin = toml::from_str(&format!("prefix = {prefix:?}\nurls = []")).unwrap();
    t.urls = urls.to_vec();
    t.connect_timeout = ms(500);
    t.first_byte_timeout = ms(300);
    t.idle_timeout = ms(300);
    t
}

#[test]
fn route_picks_the_longest_prefix_and_returns_the_rest() {
    let url = vec!["http://127.0.0.1:1/".to_string()];
    let tables = [table("/vod/", &url), table("/vod/live/", &url), table("/a/", &url)];
    let origins = Origins::start(&tables, 1).unwrap();
    assert_eq!(origins.route(b"/vod/a/b.mp4"), Some((0, &b"a/b.mp4"[..])));
    assert_eq!(origins.route(b"/vod/live/x.ts"), Some((1, &b"x.ts"[..])));
    assert_eq!(origins.route(b"/vod/livex.ts"), Some((0, &b"livex.ts"[..])));
    assert_eq!(origins.route(b"/a/"), Some((2, &b""[..])));
    assert_eq!(origins.route(b"/vod"), None);
    assert_eq!(origins.route(b"/b/x"), None);
    assert_eq!(origins.table(1).prefix, "/vod/live/");
}

#[test]
fn tasks_run_on_the_named_origin_threads() {
    let origins = Origins::start(&[], 2).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    for _ in 0..4 {
        let tx = tx.clone();
        origins.spawn(async move {
            tx.send(std::thread::current().name().map(str::to_string)).unwrap();
        });
    }
    let mut names: Vec<String> = (0..4).map(|_| rx.recv().unwrap().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["linerate-origin0", "linerate-origin0", "linerate-origin1", "linerate-origin1"]);
}
