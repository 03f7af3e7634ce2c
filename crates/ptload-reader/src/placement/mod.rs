//! Where storages go: the saved locations, the target devices, the
//! [`Mapper`] that decides, and the [`DeviceMap`] that records its
//! decisions (a [`Placement`] per storage).
//!
//! Mapping is pure: it needs no GPU, so every strategy is tested on every
//! machine. The device crate executes a device map.

mod device_map;
mod location;
mod mappers;

pub use crate::glob::glob;
pub use device_map::{DeviceMap, Placement};
pub use location::{Device, Location, MapLocation, MAP_LOCATION_GRAMMAR};
pub use mappers::{
    Balanced, Budget, ByName, BySize, First, Keep, Mapper, StorageRequest, Table, To,
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::glob::glob_captures;

    #[test]
    fn locations_parse_and_print() {
        for tag in [
            "cpu", "cuda", "cuda:3", "mps", "meta", "xpu:1", "hpu", "mtia:0", "npu:2", "cuda:x",
        ] {
            assert_eq!(Location::parse(tag).to_string(), tag);
        }
        assert_eq!(Location::parse("cuda:3"), Location::Cuda(Some(3)));
        assert_eq!(Location::parse("cuda:x"), Location::Other("cuda:x".into()));
        assert_eq!(
            Location::parse("cuda").restore().ok(),
            Some(Device::Cuda(0))
        );
        let e = Location::parse("npu:2").restore().expect_err("unknown");
        assert_eq!(
            e.message(),
            "don't know how to restore data location of torch.storage.UntypedStorage (tagged with npu:2)"
        );
        assert_eq!(
            e.hint(),
            Some(&crate::advice::Hint::MapLocation {
                from: Some("npu:2".into()),
                to: Some("cpu".into())
            })
        );
        assert!(Location::Mps.restore().is_err());
    }

    #[test]
    fn devices_parse() {
        assert_eq!("cuda".parse::<Device>().ok(), Some(Device::Cuda(0)));
        assert_eq!("cuda:2".parse::<Device>().ok(), Some(Device::Cuda(2)));
        assert_eq!("cpu".parse::<Device>().ok(), Some(Device::Host));
        assert_eq!("meta".parse::<Device>().ok(), Some(Device::Meta));
        // Typed by people: any case.
        assert_eq!("CPU".parse::<Device>().ok(), Some(Device::Host));
        assert_eq!("Cuda:1".parse::<Device>().ok(), Some(Device::Cuda(1)));
        assert!("AUTO".parse::<super::MapLocation>().is_ok());
        assert!("mps".parse::<Device>().is_err());
        assert!("cuda:-1".parse::<Device>().is_err());
    }

    #[test]
    fn globs() {
        assert!(glob("encoder.*", "encoder.layers.0.weight"));
        assert!(!glob("encoder.*", "decoder.layers.0.weight"));
        assert!(glob("*embed*", "model.embed_tokens.weight"));
        assert!(glob("layers.?.weight", "layers.3.weight"));
        assert!(!glob("layers.?.weight", "layers.12.weight"));
        assert!(glob("*", ""));
        assert!(!glob("a", ""));
        assert_eq!(
            glob_captures("encoder.*.weight", "encoder.layers.0.weight"),
            Some(vec!["layers.0"])
        );
        assert_eq!(glob_captures("*.*", "a.b.c"), Some(vec!["a", "b.c"]));
        assert_eq!(glob_captures("x*y*z", "x1y2z"), Some(vec!["1", "2"]));
        assert_eq!(glob_captures("pre*", "prefix"), Some(vec!["fix"]));
    }
}
