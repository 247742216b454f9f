// Stub of Apple's Foundation for syntax-checking metal/host/*.mm on Linux: exactly the subset
// ds4 uses, with the declarations of Apple's documentation (developer.apple.com/documentation/
// foundation). Not a working Foundation: nothing here links or runs.
#pragma once
#include <stddef.h>
#include <stdint.h>

#if __has_feature(objc_bool) || defined(__aarch64__)
typedef bool BOOL;   // arm64 Apple platforms: BOOL is bool
#else
typedef signed char BOOL;
#endif
#ifdef __cplusplus
#define nil nullptr
#else
#define nil ((void*)0)
#endif
#define YES ((BOOL)1)
#define NO ((BOOL)0)

typedef long NSInteger;
typedef unsigned long NSUInteger;

#define NS_ENUM(_type, _name) enum _name : _type _name; enum _name : _type
#define NS_OPTIONS(_type, _name) enum _name : _type _name; enum _name : _type
#define NS_RETURNS_INNER_POINTER __attribute__((objc_returns_inner_pointer))
// API_AVAILABLE(macos(15.0), ios(18.0)) and API_DEPRECATED as in Apple's <os/availability.h>, so
// that an unguarded use of a newer API is diagnosed when checking for a macOS target.
#define DS4_STUB_AVAIL_macos(v) __attribute__((availability(macos, introduced = v)))
#define DS4_STUB_AVAIL_ios(v) __attribute__((availability(ios, introduced = v)))
#define DS4_STUB_DEPR_macos(a, b) __attribute__((availability(macos, introduced = a, deprecated = b)))
#define DS4_STUB_DEPR_ios(a, b) __attribute__((availability(ios, introduced = a, deprecated = b)))
#define DS4_STUB_PICK(_1, _2, NAME, ...) NAME
#define DS4_STUB_AVAIL1(a) DS4_STUB_AVAIL_##a
#define DS4_STUB_AVAIL2(a, b) DS4_STUB_AVAIL_##a DS4_STUB_AVAIL_##b
#define DS4_STUB_DEPR1(a) DS4_STUB_DEPR_##a
#define DS4_STUB_DEPR2(a, b) DS4_STUB_DEPR_##a DS4_STUB_DEPR_##b
#define API_AVAILABLE(...) DS4_STUB_PICK(__VA_ARGS__, DS4_STUB_AVAIL2, DS4_STUB_AVAIL1)(__VA_ARGS__)
#define API_DEPRECATED(msg, ...) DS4_STUB_PICK(__VA_ARGS__, DS4_STUB_DEPR2, DS4_STUB_DEPR1)(__VA_ARGS__)

#define NS_ASSUME_NONNULL_BEGIN _Pragma("clang assume_nonnull begin")
#define NS_ASSUME_NONNULL_END _Pragma("clang assume_nonnull end")

NS_ASSUME_NONNULL_BEGIN

@protocol NSObject
@end

@protocol NSCopying
@end

__attribute__((objc_root_class))
@interface NSObject <NSObject>
+ (instancetype)alloc;
+ (instancetype)new;
- (instancetype)init;
@end

@interface NSString : NSObject <NSCopying>
+ (nullable instancetype)stringWithUTF8String:(const char* _Nonnull)nullTerminatedCString;
@property(nullable, readonly) const char* UTF8String NS_RETURNS_INNER_POINTER;
@end

@interface NSError : NSObject <NSCopying>
@property(readonly, copy) NSString* _Nonnull localizedDescription;
@end

@interface NSArray<__covariant ObjectType> : NSObject <NSCopying>
@property(readonly) NSUInteger count;
- (ObjectType _Nonnull)objectAtIndexedSubscript:(NSUInteger)idx;
@end

NS_ASSUME_NONNULL_END
