"""stockade.sandbox"""
