"""The places a trainer lives in, one file each (console/core/places/base.py says what a place is);
console/core/place.py lists them and parses flags and config entries into them."""
