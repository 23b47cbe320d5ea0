//! The servers a client (the CLI, `bench api`, an agent) may talk to: one URL or several replicas, comma-separated
//! (`--server https://a:7070,https://b:7070`), of which one leads. A client sends to the current one; a standby's
//! `307` names the leader (`Location`), and an unreachable or leaderless server makes the client move to the next.
//!
//! A redirect is followed only to a server of the list: the client's token goes nowhere it was not told to send it.
//! No I/O here: the clients drive it.

use crate::ApiError;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The servers, and which one requests go to now.
#[derive(Debug)]
pub struct ServerList {
    urls: Vec<String>,
    at: AtomicUsize,
}

impl Clone for ServerList {
    fn clone(&self) -> ServerList {
        ServerList { urls: self.urls.clone(), at: AtomicUsize::new(self.at.load(Ordering::Relaxed)) }
    }
}

/// `scheme://host:port` of a URL, the port made explicit (`https://a` and `https://a:443` are one server).
fn origin(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let host = rest.split(['/', '?', '#']).next()?.to_ascii_lowercase();
    if host.is_empty() || host.contains('@') {
        return None;
    }
    let default = match scheme {
        "https" => "443",
        "http" => "80",
        _ => return None,
    };
    // An IPv6 literal keeps its brackets; a port follows the last ':' outside them.
    let has_port = host.rsplit_once(':').is_some_and(|(_, p)| !p.contains(']') && !p.is_empty());
    Some(if has_port { format!("{scheme}://{host}") } else { format!("{scheme}://{host}:{default}") })
}

impl ServerList {
    /// Reads `field`'s value: URLs (`http://` or `https://`, no user or password in them) separated by commas.
    pub fn parse(field: &str, list: &str) -> Result<ServerList, ApiError> {
        let mut urls = Vec::new();
        for u in list.split(',').map(str::trim).filter(|u| !u.is_empty()) {
            if origin(u).is_none() {
                // A URL with a user or password in it is not echoed (it may be a secret).
                let shown = if u.contains('@') { "(a URL with a user or password)" } else { u };
                return Err(ApiError::invalid(
                    field,
                    shown,
                    "http://HOST[:PORT] or https://HOST[:PORT], comma-separated, without a user or password",
                ));
            }
            let u = u.trim_end_matches('/').to_string();
            if !urls.contains(&u) {
                urls.push(u);
            }
        }
        if urls.is_empty() {
            return Err(ApiError::invalid(field, list, "at least one server URL"));
        }
        Ok(ServerList { urls, at: AtomicUsize::new(0) })
    }

    /// The server requests go to now (no trailing `/`).
    pub fn current(&self) -> &str {
        &self.urls[self.at.load(Ordering::Relaxed) % self.urls.len()]
    }

    /// All of them, in the order given.
    pub fn all(&self) -> &[String] {
        &self.urls
    }

    /// Moves on to the next server (the current one is unreachable or knows no leader); returns it.
    pub fn rotate(&self) -> &str {
        self.at.fetch_add(1, Ordering::Relaxed);
        self.current()
    }

    /// Moves to the server `location` (a standby's redirect or its `Gpunet-Leader`) is on, when it is one of the list;
    /// false otherwise (the list stays where it was).
    pub fn follow(&self, location: &str) -> bool {
        let Some(to) = origin(location) else { return false };
        match self.urls.iter().position(|u| origin(u).as_deref() == Some(to.as_str())) {
            Some(i) => {
                self.at.store(i, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_and_bad_urls_name_the_field() {
        let l = ServerList::parse("--server", " https://a:7070/, http://127.0.0.1:7071 ,https://a:7070").unwrap();
        assert_eq!(l.all(), ["https://a:7070", "http://127.0.0.1:7071"]);
        assert_eq!(l.current(), "https://a:7070");
        for bad in ["", " , ", "a:7070", "ftp://a", "https://user:pw@a:7070"] {
            let e = ServerList::parse("--server", bad).unwrap_err();
            assert_eq!(e.field.as_deref(), Some("--server"), "{bad:?}");
            assert!(!e.message.contains("pw@"), "{}", e.message);
        }
    }

    #[test]
    fn rotation_cycles_and_redirects_are_followed_only_within_the_list() {
        let l = ServerList::parse("--server", "https://a:7070,https://b:7070,https://c").unwrap();
        assert_eq!(l.rotate(), "https://b:7070");
        assert_eq!(l.rotate(), "https://c");
        assert_eq!(l.rotate(), "https://a:7070");
        assert!(l.follow("https://C:443/v1/jobs?x=1"));
        assert_eq!(l.current(), "https://c");
        assert!(l.follow("https://b:7070"));
        assert_eq!(l.current(), "https://b:7070");
        // Elsewhere (another host, another port, plain HTTP for an HTTPS server): not followed, not moved.
        for away in ["https://evil:7070/v1/jobs", "https://a:7071", "http://a:7070", "not a url"] {
            assert!(!l.follow(away), "{away}");
            assert_eq!(l.current(), "https://b:7070");
        }
        let clone = l.clone();
        assert_eq!(clone.current(), "https://b:7070");
    }
}
