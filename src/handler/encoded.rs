//! An event's context encoded once for every hook it was queued to: the Python workers of ten
//! hooks on one event share one JSON encoding instead of making ten.
//!
//! The context is shared (`Arc<Value>`) by every hook's job, so the encoding is cached by that
//! allocation: a [`Weak`] in the entry keeps the allocation from being reused while the entry
//! exists, so a pointer match is the same context. Entries whose context is gone are pruned when
//! the cache grows past its bound; past it with every context alive, it starts over.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use serde_json::Value;

/// Entries kept before the cache prunes those whose event every hook has finished.
const MAX_ENTRIES: usize = 1024;

type Cache = Mutex<HashMap<usize, (Weak<Value>, Arc<[u8]>)>>;

fn cache() -> &'static Cache {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// The JSON text of `context`, encoded by the first hook that needed it.
pub fn context_json(context: &Arc<Value>) -> Result<Arc<[u8]>, serde_json::Error> {
    let key = Arc::as_ptr(context) as usize;
    if let Some((_, bytes)) = cache().lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
        return Ok(bytes.clone());
    }
    let bytes: Arc<[u8]> = serde_json::to_vec(&**context)?.into();
    let mut map = cache().lock().unwrap_or_else(|p| p.into_inner());
    if map.len() >= MAX_ENTRIES {
        map.retain(|_, (weak, _)| weak.strong_count() > 0);
        if map.len() >= MAX_ENTRIES {
            map.clear();
        }
    }
    map.insert(key, (Arc::downgrade(context), bytes.clone()));
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_encoding_per_context_and_never_a_stale_one() {
        let a = Arc::new(serde_json::json!({"a": 1}));
        let first = context_json(&a).unwrap();
        assert!(Arc::ptr_eq(&first, &context_json(&a.clone()).unwrap()));
        assert_eq!(&*first, br#"{"a":1}"#);
        drop(a);
        // A new context, possibly at the old address, gets its own encoding.
        for i in 0..3000 {
            let b = Arc::new(serde_json::json!({"b": i}));
            assert_eq!(
                &*context_json(&b).unwrap(),
                format!("{{\"b\":{i}}}").as_bytes()
            );
        }
    }
}
